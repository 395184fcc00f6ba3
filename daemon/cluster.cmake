# The cluster tier (issue 17): a small Redis Cluster client over Debian's
# hiredis (daemon/redis_cluster.h), the values' format (daemon/cluster_value.h)
# and the tier itself (daemon/cluster_tier.h).
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)

# The Redis Cluster client (daemon/redis_cluster.h).
add_library(kvtier_redis_cluster STATIC redis_cluster.cc redis_cluster_pool.cc
  redis_cluster_pipeline.cc resp_reader.cc)
kvtier_target_options(kvtier_redis_cluster)
target_include_directories(kvtier_redis_cluster PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(kvtier_redis_cluster PUBLIC absl::status absl::statusor
  absl::span absl::synchronization absl::time PRIVATE PkgConfig::HIREDIS
  absl::strings spdlog::spdlog)

# A real Redis Cluster for tests: redis-server processes joined by redis-cli
# (tests/redis_cluster_fixture.h).
add_library(kvtier_redis_fixture STATIC
  ${PROJECT_SOURCE_DIR}/tests/redis_cluster_fixture.cc
  ${PROJECT_SOURCE_DIR}/tests/redis_cluster_fixture_views.cc)
kvtier_target_options(kvtier_redis_fixture)
target_include_directories(kvtier_redis_fixture PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(kvtier_redis_fixture PUBLIC absl::status absl::statusor
  absl::time PRIVATE PkgConfig::HIREDIS absl::strings)

kvtier_test(resp_reader_test SOURCES resp_reader_test.cc
  LIBS kvtier_redis_cluster)
kvtier_test(redis_cluster_test SOURCES redis_cluster_test.cc
  redis_cluster_failure_test.cc
  LIBS kvtier_redis_cluster kvtier_redis_fixture)
