# libkvtier.so's third-party libraries, linked statically and hidden
# (issue 15): a pip-installed kvtier must run on a host without abseil,
# protobuf or xxhash, and beside an engine that loads its own abseil or
# protobuf in another version.
#
# KVTIER_PIC_DEPS names the output of scripts/pic-deps.sh (`make build`
# passes $(BUILD)/pic-deps): Debian's own abseil and protobuf rebuilt as
# static -fPIC archives with hidden symbols. Debian's libxxhash.a and
# libcrypto.a are used as shipped (no local-exec TLS, so they link into a
# shared object). kvtier_static_third_party(kvtier) then links these into
# libkvtier.so behind -Wl,--exclude-libs,ALL.
#
# The mechanism. The internal libraries that libkvtier.so absorbs
# (kvtier_client, kvtier_transfer, kvtier_proto, ...) name absl::*,
# protobuf::libprotobuf, PkgConfig::XXHASH and OpenSSL::Crypto in their
# link interfaces, as do gRPC's imported targets; every other consumer
# (kvtierd, kvtierctl, the tests) must keep linking Debian's shared
# libraries through them. So, once every target is defined (a deferred call
# at the end of the top-level CMakeLists.txt), each such item in the
# INTERFACE_LINK_LIBRARIES of every library the project defines and of every
# imported target (gRPC's) is replaced by a choice made on the consuming
# target (the "head" of the link, which is what $<TARGET_PROPERTY:prop>
# names in a link interface):
#
#   $<IF:$<BOOL:$<TARGET_PROPERTY:KVTIER_STATIC_THIRD_PARTY>>,
#        kvtier_pic_absl,absl::status>
#
# A target linked with KVTIER_STATIC_THIRD_PARTY set (libkvtier.so alone)
# gets the static archive; any other gets what it got before. The
# libraries' own compiles still see Debian's targets (their LINK_LIBRARIES
# are untouched), whose headers are the PIC build's own (pic-deps.sh checks
# them byte for byte). A new internal library or third-party item needs
# nothing here; a third-party library not in the map below would reach
# libkvtier.so as a shared library, and ctest libkvtier_static_deps
# (tests/check_exports.sh --needed=pic) would fail.
#
# Without KVTIER_PIC_DEPS (ad-hoc builds, the sanitizer builds) nothing is
# replaced: libkvtier.so links the shared libraries as before, with a
# warning. The sanitizer builds keep them on purpose: TSan needs every
# abseil in the process to be its instrumented one (KVTIER_TSAN_ABSEIL), and
# the ASan build tests hostile input, not packaging.

set(KVTIER_PIC_DEPS "" CACHE PATH
    "static -fPIC abseil and protobuf for libkvtier.so (scripts/pic-deps.sh)")
set(KVTIER_PIC_DEPS_ACTIVE OFF)
if(KVTIER_PIC_DEPS)
  if(KVTIER_SANITIZE MATCHES "thread")
    message(FATAL_ERROR "KVTIER_PIC_DEPS with KVTIER_SANITIZE=thread: "
                        "libkvtier.so must share the TSan abseil")
  endif()
  if(NOT EXISTS "${KVTIER_PIC_DEPS}/.complete")
    message(FATAL_ERROR "KVTIER_PIC_DEPS=${KVTIER_PIC_DEPS} is not the "
                        "output of scripts/pic-deps.sh (no .complete)")
  endif()
  set(KVTIER_PIC_DEPS_ACTIVE ON)
endif()

# Imported static libraries for the map below. Called once the
# find_package/pkg_check_modules of the top-level CMakeLists.txt have run.
macro(kvtier_pic_deps_targets)
  if(KVTIER_PIC_DEPS_ACTIVE)
    add_library(kvtier_pic_absl STATIC IMPORTED GLOBAL)
    set_target_properties(kvtier_pic_absl PROPERTIES
      IMPORTED_LOCATION ${KVTIER_PIC_DEPS}/lib/libabsl.a
      INTERFACE_LINK_LIBRARIES Threads::Threads)
    add_library(kvtier_pic_protobuf STATIC IMPORTED GLOBAL)
    set_target_properties(kvtier_pic_protobuf PROPERTIES
      IMPORTED_LOCATION ${KVTIER_PIC_DEPS}/lib/libprotobuf.a
      INTERFACE_LINK_LIBRARIES Threads::Threads)
    find_library(KVTIER_XXHASH_STATIC NAMES libxxhash.a
      HINTS ${XXHASH_LIBDIR} ${XXHASH_LIBRARY_DIRS} NO_DEFAULT_PATH)
    get_filename_component(_kvtier_crypto_dir "${OPENSSL_CRYPTO_LIBRARY}"
                           DIRECTORY)
    find_library(KVTIER_CRYPTO_STATIC NAMES libcrypto.a
      HINTS ${_kvtier_crypto_dir} NO_DEFAULT_PATH)
    if(NOT KVTIER_XXHASH_STATIC OR NOT KVTIER_CRYPTO_STATIC)
      message(FATAL_ERROR "KVTIER_PIC_DEPS needs libxxhash.a and libcrypto.a "
                          "(libxxhash-dev, libssl-dev)")
    endif()
    add_library(kvtier_pic_xxhash STATIC IMPORTED GLOBAL)
    set_target_properties(kvtier_pic_xxhash PROPERTIES
      IMPORTED_LOCATION ${KVTIER_XXHASH_STATIC})
    # libcrypto.a needs dlopen and threads (in libc since glibc 2.34).
    add_library(kvtier_pic_crypto STATIC IMPORTED GLOBAL)
    set_target_properties(kvtier_pic_crypto PROPERTIES
      IMPORTED_LOCATION ${KVTIER_CRYPTO_STATIC}
      INTERFACE_LINK_LIBRARIES "${CMAKE_DL_LIBS};Threads::Threads")
  endif()
endmacro()

# The map: a link item (an exact name, or a regular expression) -> the
# static library that replaces it for a head with KVTIER_STATIC_THIRD_PARTY.
set(_kvtier_pic_map
  "^absl::.*$" kvtier_pic_absl
  "^protobuf::libprotobuf(-lite)?$" kvtier_pic_protobuf
  "^PkgConfig::XXHASH$" kvtier_pic_xxhash
  "^OpenSSL::Crypto$" kvtier_pic_crypto)

# kvtier_static_third_party(TARGET): TARGET (a shared library) links the map's
# static libraries in place of the shared ones, all of their symbols (and
# those of every other archive it absorbs) made local, and needs at run time
# only the shared libraries it calls.
function(kvtier_static_third_party target)
  target_link_options(${target} PRIVATE -Wl,--exclude-libs,ALL
                      -Wl,--as-needed)
  if(NOT KVTIER_PIC_DEPS_ACTIVE)
    if(KVTIER_SANITIZE)
      message(STATUS "kvtier: ${target} links the shared abseil, protobuf, "
                     "libxxhash and libcrypto (sanitizer build)")
    else()
      message(WARNING "KVTIER_PIC_DEPS is not set: ${target} links the "
                      "shared abseil, protobuf, libxxhash and libcrypto "
                      "(make build sets it: scripts/pic-deps.sh)")
    endif()
    return()
  endif()
  set_target_properties(${target} PROPERTIES KVTIER_STATIC_THIRD_PARTY ON)
  get_property(_scheduled GLOBAL PROPERTY _KVTIER_PIC_SCHEDULED)
  if(NOT _scheduled)
    set_property(GLOBAL PROPERTY _KVTIER_PIC_SCHEDULED ON)
    cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR}
                   CALL _kvtier_pic_rewrite_all)
  endif()
endfunction()

# Every target defined or imported in DIR and below, into OUT.
function(_kvtier_pic_collect dir out)
  get_property(_own DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(_imported DIRECTORY ${dir} PROPERTY IMPORTED_TARGETS)
  set(_all ${${out}} ${_own} ${_imported})
  get_property(_subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(_sub ${_subdirs})
    _kvtier_pic_collect(${_sub} _all)
  endforeach()
  set(${out} ${_all} PARENT_SCOPE)
endfunction()

function(_kvtier_pic_rewrite_all)
  set(_targets "")
  _kvtier_pic_collect(${PROJECT_SOURCE_DIR} _targets)
  list(REMOVE_DUPLICATES _targets)
  set(_rewritten 0)
  list(LENGTH _kvtier_pic_map _n)
  math(EXPR _last "${_n} - 1")
  foreach(_t ${_targets})
    if(NOT TARGET ${_t})  # imported in a subdirectory, not visible here
      continue()
    endif()
    get_target_property(_type ${_t} TYPE)
    if(NOT _type MATCHES "_LIBRARY$")  # executables link nothing onward
      continue()
    endif()
    # The replacements themselves, and the targets they replace, stay.
    set(_skip OFF)
    foreach(_i RANGE 0 ${_last} 2)
      math(EXPR _j "${_i} + 1")
      list(GET _kvtier_pic_map ${_i} _pattern)
      list(GET _kvtier_pic_map ${_j} _static)
      if(_t MATCHES "${_pattern}" OR _t STREQUAL _static)
        set(_skip ON)
      endif()
    endforeach()
    get_target_property(_aliased ${_t} ALIASED_TARGET)
    if(_skip OR _aliased)
      continue()
    endif()
    get_target_property(_items ${_t} INTERFACE_LINK_LIBRARIES)
    if(NOT _items)
      continue()
    endif()
    set(_new "")
    set(_changed OFF)
    foreach(_item IN LISTS _items)
      # PRIVATE deps of a static library appear as $<LINK_ONLY:name>.
      set(_prefix "")
      set(_suffix "")
      set(_name "${_item}")
      if(_item MATCHES "^\\$<LINK_ONLY:([^<>$]+)>$")
        set(_prefix "$<LINK_ONLY:")
        set(_suffix ">")
        set(_name "${CMAKE_MATCH_1}")
      endif()
      foreach(_i RANGE 0 ${_last} 2)
        math(EXPR _j "${_i} + 1")
        list(GET _kvtier_pic_map ${_i} _pattern)
        list(GET _kvtier_pic_map ${_j} _static)
        if(_name MATCHES "${_pattern}")
          set(_head "$<BOOL:$<TARGET_PROPERTY:KVTIER_STATIC_THIRD_PARTY>>")
          set(_item "${_prefix}$<IF:${_head},${_static},${_name}>${_suffix}")
          set(_changed ON)
          break()
        endif()
      endforeach()
      list(APPEND _new "${_item}")
    endforeach()
    if(_changed)
      set_property(TARGET ${_t} PROPERTY INTERFACE_LINK_LIBRARIES "${_new}")
      math(EXPR _rewritten "${_rewritten} + 1")
    endif()
  endforeach()
  message(STATUS "kvtier: static -fPIC abseil, protobuf, libxxhash and "
                 "libcrypto for libkvtier.so (${KVTIER_PIC_DEPS}; "
                 "${_rewritten} link interfaces)")
endfunction()
