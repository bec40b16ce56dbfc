# Runs at install time (cmake --install, CPack): the files whose contents or
# places depend on the prefix being installed to. Set by install(CODE) in
# install.cmake: KVT_SRC, KVT_BIN_DIR, KVT_VERSION, KVT_BINDIR, KVT_LIBDIR,
# KVT_INCLUDEDIR. file(INSTALL) prepends $DESTDIR itself.
set(prefix "${CMAKE_INSTALL_PREFIX}")
if(prefix STREQUAL "/usr")
  set(etc "/etc")
  set(unitdir "/lib/systemd/system")
  set(sysusersdir "/usr/lib/sysusers.d")
else()
  set(etc "${prefix}/etc")
  set(unitdir "${prefix}/lib/systemd/system")
  set(sysusersdir "${prefix}/lib/sysusers.d")
endif()
set(gen "${KVT_BIN_DIR}/packaging/${prefix}")
string(REPLACE "//" "/" gen "${gen}")

# kvtier.pc and kvtier.service from their templates (@VAR@ -> the values)
set(KVT_PC_LIBDIR "\${exec_prefix}/${KVT_LIBDIR}")
set(KVT_PC_INCLUDEDIR "\${prefix}/${KVT_INCLUDEDIR}")
set(PROJECT_VERSION "${KVT_VERSION}")
set(CMAKE_INSTALL_FULL_BINDIR "${prefix}/${KVT_BINDIR}")
set(KVT_FULL_SYSCONFDIR "${etc}")
configure_file("${KVT_SRC}/packaging/kvtier.pc.in" "${gen}/kvtier.pc" @ONLY)
file(INSTALL DESTINATION "${prefix}/${KVT_LIBDIR}/pkgconfig" TYPE FILE FILES "${gen}/kvtier.pc")

# the systemd unit and its user
configure_file("${KVT_SRC}/packaging/kvtier.service.in" "${gen}/kvtier.service" @ONLY)
file(INSTALL DESTINATION "${unitdir}" TYPE FILE FILES "${gen}/kvtier.service")
file(INSTALL DESTINATION "${sysusersdir}" TYPE FILE RENAME kvtier.conf
     FILES "${KVT_SRC}/packaging/kvtier.sysusers")

# example configs (the shipped ones: KVP_CACHE_ROOT under /var/lib/kvtier)
file(INSTALL DESTINATION "${etc}/kvtier" TYPE FILE
     FILES "${KVT_SRC}/configs/cache.env" "${KVT_SRC}/configs/quotas.json")
