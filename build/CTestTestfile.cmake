# CMake generated Testfile for 
# Source directory: /work/main
# Build directory: /work/main/build
# 
# This file includes the relevant testing commands required for 
# testing this directory and lists subdirectories to be tested as well.
add_test([=[test_cli]=] "/work/main/build/test_cli")
set_tests_properties([=[test_cli]=] PROPERTIES  SKIP_RETURN_CODE "77" TIMEOUT "1500" _BACKTRACE_TRIPLES "/work/main/CMakeLists.txt;83;add_test;/work/main/CMakeLists.txt;0;")
add_test([=[test_gguf]=] "/work/main/build/test_gguf")
set_tests_properties([=[test_gguf]=] PROPERTIES  SKIP_RETURN_CODE "77" TIMEOUT "1500" _BACKTRACE_TRIPLES "/work/main/CMakeLists.txt;83;add_test;/work/main/CMakeLists.txt;0;")
add_test([=[test_kv_basic]=] "/work/main/build/test_kv_basic")
set_tests_properties([=[test_kv_basic]=] PROPERTIES  SKIP_RETURN_CODE "77" TIMEOUT "1500" _BACKTRACE_TRIPLES "/work/main/CMakeLists.txt;83;add_test;/work/main/CMakeLists.txt;0;")
add_test([=[test_model]=] "/work/main/build/test_model")
set_tests_properties([=[test_model]=] PROPERTIES  SKIP_RETURN_CODE "77" TIMEOUT "1500" _BACKTRACE_TRIPLES "/work/main/CMakeLists.txt;83;add_test;/work/main/CMakeLists.txt;0;")
add_test([=[test_sampler]=] "/work/main/build/test_sampler")
set_tests_properties([=[test_sampler]=] PROPERTIES  SKIP_RETURN_CODE "77" TIMEOUT "1500" _BACKTRACE_TRIPLES "/work/main/CMakeLists.txt;83;add_test;/work/main/CMakeLists.txt;0;")
add_test([=[test_stories]=] "/work/main/build/test_stories")
set_tests_properties([=[test_stories]=] PROPERTIES  SKIP_RETURN_CODE "77" TIMEOUT "1500" _BACKTRACE_TRIPLES "/work/main/CMakeLists.txt;83;add_test;/work/main/CMakeLists.txt;0;")
add_test([=[test_tensor]=] "/work/main/build/test_tensor")
set_tests_properties([=[test_tensor]=] PROPERTIES  SKIP_RETURN_CODE "77" TIMEOUT "1500" _BACKTRACE_TRIPLES "/work/main/CMakeLists.txt;83;add_test;/work/main/CMakeLists.txt;0;")
add_test([=[test_threadpool]=] "/work/main/build/test_threadpool")
set_tests_properties([=[test_threadpool]=] PROPERTIES  SKIP_RETURN_CODE "77" TIMEOUT "1500" _BACKTRACE_TRIPLES "/work/main/CMakeLists.txt;83;add_test;/work/main/CMakeLists.txt;0;")
