# `make deb`: one binary package, kvtier_<version>-1_<arch>.deb, with CPack's
# DEB generator. Depends come from dpkg-shlibdeps (the shared libraries the
# binary and the client library link) plus adduser for the postinst, which
# creates the service's system user. The configs under /etc/kvtier are
# conffiles: an upgrade keeps the operator's edits.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvtier)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "tiered persistent KV-cache store for LLM inference")
# CPack prefixes the summary as the synopsis line and indents each line
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "kvtier keeps the attention KV cache of prompt prefixes for inference
engines (vLLM, LMCache): hot chunks in a shared-memory tier, all of them
in persistent tiers (files, block devices, Redis, S3), across restarts.

This package has the server (kvtier), its systemd unit, the C client
library with its headers and pkg-config file, and the man pages.")
set(CPACK_PACKAGE_CONTACT "kvtier developers <kvtier@example.org>")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "kvtier developers <kvtier@example.org>")
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION database)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
# a shlibs file for libkvtier_client.so.0, and the ldconfig trigger
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_SOURCE_DIR}/packaging/debian/conffiles
    ${CMAKE_SOURCE_DIR}/packaging/debian/postinst
    ${CMAKE_SOURCE_DIR}/packaging/debian/triggers)
set(CPACK_OUTPUT_FILE_PREFIX ${CMAKE_BINARY_DIR}/deb)
include(CPack)
