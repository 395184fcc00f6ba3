# Clang's thread-safety analysis (-Wthread-safety) checks the project's
# ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED annotations at compile
# time; with -Werror below, a lock not held where one is required fails the
# build. On by default wherever the compiler is clang (`make test-asan`,
# `make test-tsan`); gcc has no such analysis.
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  set(_kvtier_thread_safety_default ON)
else()
  set(_kvtier_thread_safety_default OFF)
endif()
option(KVTIER_THREAD_SAFETY "clang -Wthread-safety on the project's code"
       ${_kvtier_thread_safety_default})
if(KVTIER_THREAD_SAFETY AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "KVTIER_THREAD_SAFETY needs clang (CXX=clang++)")
endif()

# Compile options shared by every target the project owns. Generated code
# (protobuf, gRPC) does not use these: it is not ours to keep warning-free.
function(kvtier_target_options target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Werror --Werror=all-warnings>)
  if(KVTIER_THREAD_SAFETY)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety>)
  endif()
endfunction()

# kvtier_test(NAME SOURCES... [LIBS ...] [LABELS ...]): a GoogleTest binary
# registered with ctest.
function(kvtier_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  kvtier_target_options(${name})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300)
  if(ARG_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
  # A GPU test binary whose every test called GTEST_SKIP() (no device) shows
  # as skipped, not passed.
  if("gpu" IN_LIST ARG_LABELS)
    set_tests_properties(${name} PROPERTIES
      SKIP_REGULAR_EXPRESSION "\\[  PASSED  \\] 0 tests")
  endif()
endfunction()
