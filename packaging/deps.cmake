# The libraries kvtier builds against (included from the top-level
# CMakeLists.txt). Each missing one is named with the Debian package that
# provides its headers, and configuring stops with one message listing them
# all: a `pip install kvtier-<v>.tar.gz` that finds no wheel for its machine
# builds from source and says which packages to install.
find_package(PkgConfig QUIET)
if(NOT PKG_CONFIG_FOUND)
  message(FATAL_ERROR "kvtier: pkg-config is missing. On Debian/Ubuntu: "
    "sudo apt-get install pkg-config (and the -dev packages scripts/install-deps.sh lists)")
endif()

set(KVT_MISSING_DEBS "")
# kvt_need(VAR pkg-config-module debian-package): PkgConfig::VAR
macro(kvt_need var module deb)
  pkg_check_modules(${var} QUIET IMPORTED_TARGET ${module})
  if(NOT ${var}_FOUND)
    list(APPEND KVT_MISSING_DEBS ${deb})
    message(STATUS "kvtier: ${module} not found (Debian package ${deb})")
  endif()
endmacro()

kvt_need(ZMQ libzmq libzmq3-dev)
kvt_need(JANSSON jansson libjansson-dev)
kvt_need(CRYPTO libcrypto libssl-dev)
kvt_need(XXHASH libxxhash libxxhash-dev)
kvt_need(MHD libmicrohttpd libmicrohttpd-dev)
kvt_need(URING liburing liburing-dev)
kvt_need(HIREDIS hiredis libhiredis-dev)
kvt_need(CURL libcurl libcurl4-openssl-dev)
# raw_block: what a device holds before it is formatted (file systems,
# partition tables, RAID, LVM)
kvt_need(BLKID blkid libblkid-dev)
# serde compressors (src/serde)
kvt_need(LZ4 liblz4 liblz4-dev)
kvt_need(ZSTD libzstd libzstd-dev)
find_library(MSGPACK_LIB NAMES msgpackc msgpack-c)
find_path(MSGPACK_INC msgpack.h)
if(NOT MSGPACK_LIB OR NOT MSGPACK_INC)
  list(APPEND KVT_MISSING_DEBS libmsgpack-dev)
  message(STATUS "kvtier: msgpack-c not found (Debian package libmsgpack-dev)")
endif()

if(KVT_MISSING_DEBS)
  list(JOIN KVT_MISSING_DEBS " " _kvt_debs)
  # NOTICE: one unwrapped line to copy (CMake wraps FATAL_ERROR's text)
  message(NOTICE "\nkvtier: missing to build from source: on Debian 12 / Ubuntu run\n"
    "  sudo apt-get install ${_kvt_debs}\n")
  message(FATAL_ERROR "kvtier: libraries missing to build from source (above: the Debian "
    "packages to install; the whole list, with the compiler and CMake, is kvtier's "
    "scripts/install-deps.sh). Or install a kvtier wheel built for this machine.")
endif()
