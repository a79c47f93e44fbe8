
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/src/cli/args.c" "CMakeFiles/headroom.dir/src/cli/args.c.o" "gcc" "CMakeFiles/headroom.dir/src/cli/args.c.o.d"
  "/work/main/src/cli/cmd_run.c" "CMakeFiles/headroom.dir/src/cli/cmd_run.c.o" "gcc" "CMakeFiles/headroom.dir/src/cli/cmd_run.c.o.d"
  "/work/main/src/cli/cmd_stubs.c" "CMakeFiles/headroom.dir/src/cli/cmd_stubs.c.o" "gcc" "CMakeFiles/headroom.dir/src/cli/cmd_stubs.c.o.d"
  "/work/main/src/cli/cmd_synth.c" "CMakeFiles/headroom.dir/src/cli/cmd_synth.c.o" "gcc" "CMakeFiles/headroom.dir/src/cli/cmd_synth.c.o.d"
  "/work/main/src/cli/main.c" "CMakeFiles/headroom.dir/src/cli/main.c.o" "gcc" "CMakeFiles/headroom.dir/src/cli/main.c.o.d"
  "/work/main/src/cli/session.c" "CMakeFiles/headroom.dir/src/cli/session.c.o" "gcc" "CMakeFiles/headroom.dir/src/cli/session.c.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  "/work/main/build/CMakeFiles/hr_model.dir/DependInfo.cmake"
  "/work/main/build/CMakeFiles/hr_tokenizer.dir/DependInfo.cmake"
  "/work/main/build/CMakeFiles/hr_sampler.dir/DependInfo.cmake"
  "/work/main/build/CMakeFiles/hr_kv.dir/DependInfo.cmake"
  "/work/main/build/CMakeFiles/hr_backend_cpu.dir/DependInfo.cmake"
  "/work/main/build/CMakeFiles/hr_gguf.dir/DependInfo.cmake"
  "/work/main/build/CMakeFiles/hr_tensor.dir/DependInfo.cmake"
  "/work/main/build/CMakeFiles/hr_common.dir/DependInfo.cmake"
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
