file(REMOVE_RECURSE
  "CMakeFiles/headroom.dir/src/cli/args.c.o"
  "CMakeFiles/headroom.dir/src/cli/args.c.o.d"
  "CMakeFiles/headroom.dir/src/cli/cmd_run.c.o"
  "CMakeFiles/headroom.dir/src/cli/cmd_run.c.o.d"
  "CMakeFiles/headroom.dir/src/cli/cmd_stubs.c.o"
  "CMakeFiles/headroom.dir/src/cli/cmd_stubs.c.o.d"
  "CMakeFiles/headroom.dir/src/cli/cmd_synth.c.o"
  "CMakeFiles/headroom.dir/src/cli/cmd_synth.c.o.d"
  "CMakeFiles/headroom.dir/src/cli/main.c.o"
  "CMakeFiles/headroom.dir/src/cli/main.c.o.d"
  "CMakeFiles/headroom.dir/src/cli/session.c.o"
  "CMakeFiles/headroom.dir/src/cli/session.c.o.d"
  "headroom"
  "headroom.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/headroom.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
