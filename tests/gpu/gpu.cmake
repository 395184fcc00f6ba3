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

# Two engine processes with GPU pools around a real kvtierd.
if(KVTIER_HAVE_CUDA)
  add_executable(kvtier_gpu_engine ${CMAKE_CURRENT_LIST_DIR}/gpu_engine_main.cc)
  kvtier_target_options(kvtier_gpu_engine)
  target_link_libraries(kvtier_gpu_engine PRIVATE kvtier_client
    CUDA::cudart_static)
  set_target_properties(kvtier_gpu_engine PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/gpu)
  kvtier_test(gpu_multiprocess_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/gpu_multiprocess_test.cc
    LIBS kvtier_test_support CUDA::cudart_static
    LABELS gpu)
  target_compile_definitions(gpu_multiprocess_test PRIVATE
    KVTIER_GPU_ENGINE_PATH="$<TARGET_FILE:kvtier_gpu_engine>")
  set_target_properties(gpu_multiprocess_test PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/gpu)
  add_dependencies(gpu_multiprocess_test kvtier_gpu_engine kvtierd)
endif()

# Sparse-attention offload: mirror store and ensure against their references.
if(KVTIER_HAVE_CUDA)
  kvtier_test(mirror_gpu_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/mirror_gpu_test.cc
    LIBS kvtier_kernels CUDA::cudart_static
    LABELS gpu)
  set_target_properties(mirror_gpu_test PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/gpu)
endif()

# The daemon-owned device pool (kvtierd --device_pool_bytes): an engine
# killed while holding it, a restore device-to-device in a new process, the
# daemon's stop seen as UNAVAILABLE; and a TP=2 group across two GPUs
# (skips with fewer).
if(KVTIER_HAVE_CUDA)
  add_executable(kvtier_device_pool_engine
    ${CMAKE_CURRENT_LIST_DIR}/device_pool_engine_main.cc)
  kvtier_target_options(kvtier_device_pool_engine)
  target_link_libraries(kvtier_device_pool_engine PRIVATE kvtier_client
    CUDA::cudart_static)
  set_target_properties(kvtier_device_pool_engine PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/gpu)
  foreach(t device_pool_gpu_test tp2_gpu_test)
    kvtier_test(${t} SOURCES ${CMAKE_CURRENT_LIST_DIR}/${t}.cc
      LIBS kvtier_test_support CUDA::cudart_static
      LABELS gpu)
    target_compile_definitions(${t} PRIVATE
      KVTIER_DEVICE_POOL_ENGINE_PATH="$<TARGET_FILE:kvtier_device_pool_engine>")
    set_target_properties(${t} PROPERTIES
      RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/gpu)
    add_dependencies(${t} kvtier_device_pool_engine kvtierd)
  endforeach()
endif()

# Adoption of a mirror into the prefix index around a real kvtierd; the
# host-written case runs without a device.
if(KVTIER_HAVE_CUDA)
  kvtier_test(mirror_adopt_gpu_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/mirror_adopt_gpu_test.cc
    LIBS kvtier_client kvtier_test_support CUDA::cudart_static
    LABELS gpu)
  set_target_properties(mirror_adopt_gpu_test PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/gpu)
  add_dependencies(mirror_adopt_gpu_test kvtierd kvtier_test_client)
endif()

# The fence (issue 13) with real CUDA copies queued behind a spin kernel
# across daemon restarts: tests/fence_test.cc built with KVTIER_FENCE_CUDA.
if(KVTIER_HAVE_CUDA)
  kvtier_test(fence_gpu_test
    SOURCES ${PROJECT_SOURCE_DIR}/tests/fence_test.cc
      ${PROJECT_SOURCE_DIR}/tests/daemon_probe.cc
    LIBS kvtier_test_support kvtier_client kvtier_proto CUDA::cudart_static
    LABELS gpu)
  target_compile_definitions(fence_gpu_test PRIVATE KVTIER_FENCE_CUDA=1
    KVTIER_FENCE_CLIENT_PATH="$<TARGET_FILE:kvtier_fence_client>")
  set_target_properties(fence_gpu_test PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/gpu)
  add_dependencies(fence_gpu_test kvtierd kvtier_fence_client)
  set_tests_properties(fence_gpu_test PROPERTIES RUN_SERIAL TRUE)
endif()

# A mirror whose session ended stores nothing, captured graphs included.
if(KVTIER_HAVE_CUDA)
  kvtier_test(mirror_fence_gpu_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/mirror_fence_gpu_test.cc
      ${PROJECT_SOURCE_DIR}/tests/daemon_probe.cc
    LIBS kvtier_test_support kvtier_client kvtier_proto CUDA::cudart_static
    LABELS gpu)
  set_target_properties(mirror_fence_gpu_test PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/gpu)
  add_dependencies(mirror_fence_gpu_test kvtierd)
endif()

# The C ABI's CUDA paths through libkvtier.so: a kvt_mirror store captured
# in a CUDA graph, ensure and adoption; the device pool's device snapshots.
if(KVTIER_HAVE_CUDA)
  kvtier_test(c_api_mirror_gpu_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/c_api_mirror_gpu_test.cc
    LIBS kvtier kvtier_test_support CUDA::cudart_static
    LABELS gpu)
  set_target_properties(c_api_mirror_gpu_test PROPERTIES
    RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/gpu)
  add_dependencies(c_api_mirror_gpu_test kvtierd)
endif()
