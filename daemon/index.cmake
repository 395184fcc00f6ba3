# kvtier_index: the per-namespace prefix index (daemon/prefix_index.h).
add_library(kvtier_index STATIC ${CMAKE_CURRENT_LIST_DIR}/prefix_index.cc
  ${CMAKE_CURRENT_LIST_DIR}/prefix_index_alloc.cc)
kvtier_target_options(kvtier_index)
target_include_directories(kvtier_index PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(kvtier_index PUBLIC
  absl::status absl::statusor absl::flat_hash_set absl::flat_hash_map
  absl::btree absl::span absl::strings absl::hash absl::time)

kvtier_test(prefix_index_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/prefix_index_test.cc
  LIBS kvtier_index)
