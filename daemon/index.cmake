# kvtier_index: the per-namespace prefix index (daemon/prefix_index.h), its
# row pools (daemon/row_pool.h) and node pool (daemon/node_pool.h).
add_library(kvtier_index STATIC
  ${CMAKE_CURRENT_LIST_DIR}/row_pool.cc
  ${CMAKE_CURRENT_LIST_DIR}/node_pool.cc
  ${CMAKE_CURRENT_LIST_DIR}/prefix_index.cc
  ${CMAKE_CURRENT_LIST_DIR}/prefix_index_alloc.cc
  ${CMAKE_CURRENT_LIST_DIR}/prefix_index_evict.cc
  ${CMAKE_CURRENT_LIST_DIR}/prefix_index_lookup.cc
  ${CMAKE_CURRENT_LIST_DIR}/prefix_index_commit.cc
  ${CMAKE_CURRENT_LIST_DIR}/prefix_index_introspect.cc
  ${CMAKE_CURRENT_LIST_DIR}/prefix_index_check.cc)
kvtier_target_options(kvtier_index)
target_include_directories(kvtier_index PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(kvtier_index PUBLIC
  absl::status absl::statusor absl::flat_hash_set absl::flat_hash_map
  absl::btree absl::span absl::strings absl::hash absl::time)

# One binary, split by job like the sources.
kvtier_test(prefix_index_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/prefix_index_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/prefix_index_lookup_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/prefix_index_snapshot_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/prefix_index_alloc_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/prefix_index_commit_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/prefix_index_test_util.cc
  LIBS kvtier_index absl::strings absl::flat_hash_map)
kvtier_test(row_pool_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/row_pool_test.cc LIBS kvtier_index)
kvtier_test(node_pool_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/node_pool_test.cc LIBS kvtier_index)
