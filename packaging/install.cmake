# Install rules (included from the top-level CMakeLists.txt).
#
#   cmake --install build [--prefix P]     (DESTDIR=... honoured)
#   make install PREFIX=/usr/local DESTDIR=/tmp/root
#   make deb                                (CPack's DEB generator, below)
#
# Paths that depend on the prefix (/etc, the systemd unit directory, the
# prefix written into kvtier.pc and kvtier.service) are decided when the
# install runs, not when CMake configures: `cmake --install --prefix`, `make
# install PREFIX=` and CPack (which installs under /usr) all get files that
# name the prefix they were installed under. Prefix /usr means a system
# install: /etc/kvtier and /lib/systemd/system, as Debian's packages have it.
include(GNUInstallDirs)

install(TARGETS kvtier RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS kvtier_client LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES include/kvtier/client.h include/kvtier/error.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvtier)

# man pages, compressed as Debian wants them
find_program(GZIP_EXE gzip REQUIRED)
set(KVT_MAN_PAGES man/kvtier.1 man/kvtier-cache.env.5)
set(KVT_MAN_GZ "")
foreach(page ${KVT_MAN_PAGES})
  get_filename_component(name ${page} NAME)
  string(REGEX REPLACE ".*\\.([0-9])$" "\\1" sect ${name})
  set(gz ${CMAKE_BINARY_DIR}/man/${name}.gz)
  add_custom_command(OUTPUT ${gz}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
    COMMAND ${GZIP_EXE} -9nc ${CMAKE_SOURCE_DIR}/${page} > ${gz}
    DEPENDS ${CMAKE_SOURCE_DIR}/${page} VERBATIM)
  list(APPEND KVT_MAN_GZ ${gz})
  install(FILES ${gz} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${sect})
endforeach()
add_custom_target(kvtier_man ALL DEPENDS ${KVT_MAN_GZ})

set(KVT_CHANGELOG_GZ ${CMAKE_BINARY_DIR}/packaging/changelog.Debian.gz)
add_custom_command(OUTPUT ${KVT_CHANGELOG_GZ}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/packaging
  COMMAND ${GZIP_EXE} -9nc ${CMAKE_SOURCE_DIR}/packaging/debian/changelog > ${KVT_CHANGELOG_GZ}
  DEPENDS ${CMAKE_SOURCE_DIR}/packaging/debian/changelog VERBATIM)
add_custom_target(kvtier_changelog ALL DEPENDS ${KVT_CHANGELOG_GZ})
install(FILES packaging/debian/copyright ${KVT_CHANGELOG_GZ} DESTINATION ${CMAKE_INSTALL_DOCDIR})

# generated at install time: see the comment at the top
install(CODE "set(KVT_SRC \"${CMAKE_SOURCE_DIR}\")
set(KVT_BIN_DIR \"${CMAKE_BINARY_DIR}\")
set(KVT_VERSION \"${PROJECT_VERSION}\")
set(KVT_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
set(KVT_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
set(KVT_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")")
install(SCRIPT packaging/install-generated.cmake)
