# kvtier_proto_library(NAME ROOT <dir> PROTOS <relative paths>...): two static
# libraries of the C++ code generated from .proto files under ROOT, with the
# generated headers on their public include path: NAME_messages, the protobuf
# messages alone (libkvtier, which speaks no gRPC, and the daemon's core), and
# NAME, the gRPC services over them.
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
  set(msg_srcs ${srcs})
  list(FILTER msg_srcs EXCLUDE REGEX "\\.grpc\\.pb\\.cc$")
  set(grpc_srcs ${srcs})
  list(FILTER grpc_srcs INCLUDE REGEX "\\.grpc\\.pb\\.cc$")
  add_library(${name}_messages STATIC ${msg_srcs})
  target_include_directories(${name}_messages PUBLIC ${out})
  target_link_libraries(${name}_messages PUBLIC protobuf::libprotobuf)
  add_library(${name} STATIC ${grpc_srcs})
  target_link_libraries(${name} PUBLIC ${name}_messages gRPC::grpc++)
endfunction()
