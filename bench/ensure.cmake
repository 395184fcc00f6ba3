# ensure_bench: the sparse-attention offload kernels (missed pages moved
# against the contiguous ceiling, the mirror's cost on a decode-step proxy,
# hit rate against pool size). GPU only; prints one JSON object.
include_guard(GLOBAL)

if(KVTIER_HAVE_CUDA)
  add_executable(ensure_bench ${CMAKE_CURRENT_LIST_DIR}/ensure_bench.cc)
  kvtier_target_options(ensure_bench)
  target_link_libraries(ensure_bench PRIVATE kvtier_kernels
    CUDA::cudart_static absl::flags absl::flags_parse absl::str_format
    absl::strings)
endif()
