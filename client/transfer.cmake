# Transfer planning and execution, and block hashing (included by
# client/CMakeLists.txt). Paths are relative to this file so the include works
# from any directory.
#
#   kvtier_block_hash  client/block_hash.h: SHA-256 (libcrypto), XXH3-128
#   kvtier_transfer    client/pool.h, client/transfer_plan.h,
#                      client/transfer_engine.h: descriptor validation,
#                      slicing, and the CUDA / reference backends
#
# Both are static, position-independent libraries for libkvtier to absorb.

set(_kvtier_client_dir ${CMAKE_CURRENT_LIST_DIR})

add_library(kvtier_block_hash STATIC ${_kvtier_client_dir}/block_hash.cc)
kvtier_target_options(kvtier_block_hash)
target_include_directories(kvtier_block_hash PUBLIC ${_kvtier_client_dir}/..)
target_link_libraries(kvtier_block_hash
  PUBLIC absl::status absl::statusor absl::span
  PRIVATE absl::strings OpenSSL::Crypto PkgConfig::XXHASH)

add_library(kvtier_transfer STATIC
  ${_kvtier_client_dir}/transfer_plan.cc
  ${_kvtier_client_dir}/transfer_plan_copies.cc
  ${_kvtier_client_dir}/transfer_plan_slices.cc
  ${_kvtier_client_dir}/transfer_plan_groups.cc
  ${_kvtier_client_dir}/transfer_engine.cc
  ${_kvtier_client_dir}/transfer_lane.cc
  ${_kvtier_client_dir}/transfer_checks.cc
  ${_kvtier_client_dir}/reference_stream.cc)
kvtier_target_options(kvtier_transfer)
target_include_directories(kvtier_transfer PUBLIC
  ${_kvtier_client_dir}/..)       # client/pool.h, client/transfer_plan.h
# kvtier_kernels carries KVTIER_HAVE_CUDA=0/1 and, with CUDA, the static
# CUDA runtime.
target_link_libraries(kvtier_transfer
  PUBLIC kvtier_kernels absl::status absl::statusor absl::span
  PRIVATE absl::strings absl::str_format absl::synchronization
  absl::flat_hash_set Threads::Threads)

kvtier_test(block_hash_test
  SOURCES ${_kvtier_client_dir}/block_hash_test.cc
  LIBS kvtier_block_hash OpenSSL::Crypto PkgConfig::XXHASH absl::strings)
kvtier_test(transfer_plan_test
  SOURCES ${_kvtier_client_dir}/transfer_plan_test.cc
  LIBS kvtier_transfer)
kvtier_test(transfer_plan_2d_test
  SOURCES ${_kvtier_client_dir}/transfer_plan_2d_test.cc
  LIBS kvtier_transfer)
kvtier_test(transfer_engine_test
  SOURCES ${_kvtier_client_dir}/transfer_engine_test.cc
  LIBS kvtier_transfer)
kvtier_test(transfer_engine_staged_test
  SOURCES ${_kvtier_client_dir}/transfer_engine_staged_test.cc
  LIBS kvtier_transfer)
kvtier_test(reference_stream_test
  SOURCES ${_kvtier_client_dir}/reference_stream_test.cc
  LIBS kvtier_transfer)
