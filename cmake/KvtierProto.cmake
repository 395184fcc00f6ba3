# kvtier_proto_library(NAME ROOT <dir> PROTOS <relative paths>...): a static
# library of the protobuf and gRPC C++ code generated from .proto files under
# ROOT, with the generated headers on its public include path.
function(kvtier_proto_library name)
  cmake_parse_arguments(ARG "" "ROOT" "PROTOS" ${ARGN})
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${name}_gen)
  file(MAKE_DIRECTORY ${out})
  set(srcs "")
  set(abs "")
  foreach(p ${ARG_PROTOS})
    string(REGEX REPLACE "\\.proto$" "" stem ${p})
    list(APPEND srcs ${out}/${stem}.pb.cc ${out}/${stem}.grpc.pb.cc)
    list(APPEND abs ${ARG_ROOT}/${p})
  endforeach()
  add_custom_command(
    OUTPUT ${srcs}
    COMMAND protobuf::protoc --proto_path=${ARG_ROOT} --cpp_out=${out}
      --grpc_out=${out}
      --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>
      ${abs}
    DEPENDS ${abs} protobuf::protoc gRPC::grpc_cpp_plugin
    COMMENT "protoc ${ARG_PROTOS}")
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} PUBLIC ${out})
  target_link_libraries(${name} PUBLIC protobuf::libprotobuf gRPC::grpc++)
endfunction()
