# GPU benchmarks (included by bench/CMakeLists.txt; built only with CUDA).
#
#   transfer_bench  evict / rehydrate GB/s of kvtier's copy kernel against the
#                   usual ways (one contiguous copy, a per-chunk
#                   cudaMemcpyAsync loop, one cudaMemcpyBatchAsync), both
#                   directions at once, and the slowdown each causes to a
#                   concurrent cuBLAS GEMM
#   attach_bench    populate, map and cudaHostRegister a bank on 4 KiB and on
#                   2 MiB hugetlbfs pages, and attach it from a second process
#
# Neither binary links cuBLAS: transfer_bench dlopen()s libcublas.so.13 at run
# time (a 600 MB library pair that the GPU-host bundle cannot carry; the GEMM
# part is skipped with a note where it is missing), so only the headers are
# needed here. Both print one JSON object on stdout; see each file's comment.
include_guard(GLOBAL)

if(KVTIER_HAVE_CUDA)
  # transfer_bench.cc (flags, setup, main) and its parts; transfer_bench.h
  # says which file holds what.
  add_executable(transfer_bench
    ${CMAKE_CURRENT_LIST_DIR}/transfer_bench.cc
    ${CMAKE_CURRENT_LIST_DIR}/transfer_bench.h
    ${CMAKE_CURRENT_LIST_DIR}/transfer_bench_common.cc
    ${CMAKE_CURRENT_LIST_DIR}/transfer_bench_gemm.cc
    ${CMAKE_CURRENT_LIST_DIR}/transfer_bench_interference.cc
    ${CMAKE_CURRENT_LIST_DIR}/transfer_bench_json.cc
    ${CMAKE_CURRENT_LIST_DIR}/transfer_bench_layouts.cc
    ${CMAKE_CURRENT_LIST_DIR}/transfer_bench_measure.cc
    ${CMAKE_CURRENT_LIST_DIR}/transfer_bench_transfers.cc
    ${CMAKE_CURRENT_LIST_DIR}/picker.cc)
  kvtier_target_options(transfer_bench)
  # kvtier_transfer brings kvtier_kernels (KVTIER_HAVE_CUDA=1, the static
  # CUDA runtime and its headers).
  target_include_directories(transfer_bench PRIVATE ${PROJECT_SOURCE_DIR}
    ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(transfer_bench PRIVATE kvtier_transfer
    CUDA::cudart_static absl::flags absl::flags_parse absl::str_format
    absl::strings absl::time ${CMAKE_DL_LIBS} Threads::Threads)

  # The engine's own registration path (client/cuda_host.cc: cudaHostRegister
  # in <= 64 GiB chunks), compiled in rather than linking kvtier_client, which
  # would drag gRPC into a benchmark that needs none of it.
  add_executable(attach_bench ${CMAKE_CURRENT_LIST_DIR}/attach_bench.cc
    ${PROJECT_SOURCE_DIR}/client/cuda_host.cc)
  kvtier_target_options(attach_bench)
  target_include_directories(attach_bench PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(attach_bench PRIVATE kvtier_shm kvtier_kernels
    CUDA::cudart_static absl::flags absl::flags_parse absl::str_format
    absl::strings absl::time absl::cleanup)
endif()
