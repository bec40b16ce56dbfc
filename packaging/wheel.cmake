# The wheel's layout (python/pyproject.toml; scikit-build-core installs the
# "wheel" component into the wheel's platlib):
#   kvtier/_bin/kvtier              the server binary (the `kvtier` command
#                                   execs it: python/kvtier/_cli.py)
#   kvtier/libkvtier_client.so      what `import kvtier` loads first
# auditwheel repair then copies the shared libraries both need into
# kvtier.libs/ and points their RPATH there (docs/wheel.md).
install(TARGETS kvtier RUNTIME DESTINATION kvtier/_bin COMPONENT wheel)
# one file, no soname symlinks (a wheel has no links); its soname stays
# libkvtier_client.so.0
install(FILES $<TARGET_FILE:kvtier_client> DESTINATION kvtier RENAME libkvtier_client.so
        COMPONENT wheel)
