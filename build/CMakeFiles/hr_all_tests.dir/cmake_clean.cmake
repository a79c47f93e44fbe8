file(REMOVE_RECURSE
  "CMakeFiles/hr_all_tests"
)

# Per-language clean rules from dependency scanning.
foreach(lang )
  include(CMakeFiles/hr_all_tests.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
