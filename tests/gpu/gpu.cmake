# GPU tests (ctest label "gpu"): the transfer engine's CUDA backend against
# its reference backend. They build wherever CUDA builds and GTEST_SKIP() at
# run time where no device is present. Included by tests/CMakeLists.txt;
# binaries land in <build>/tests/gpu/.
include_guard(GLOBAL)

if(KVTIER_HAVE_CUDA)
  kvtier_test(transfer_engine_gpu_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/transfer_engine_gpu_test.cc
    LIBS kvtier_transfer
    LABELS gpu)
  set_target_properties(transfer_engine_gpu_test PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/gpu)
  # Pools of several GiB and registered host banks: allow for slow hosts.
  set_tests_properties(transfer_engine_gpu_test PROPERTIES TIMEOUT 600)
endif()
