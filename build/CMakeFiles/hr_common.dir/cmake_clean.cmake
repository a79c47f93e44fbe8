file(REMOVE_RECURSE
  "CMakeFiles/hr_common.dir/src/common/status.c.o"
  "CMakeFiles/hr_common.dir/src/common/status.c.o.d"
  "CMakeFiles/hr_common.dir/src/common/util.c.o"
  "CMakeFiles/hr_common.dir/src/common/util.c.o.d"
  "libhr_common.a"
  "libhr_common.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/hr_common.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
