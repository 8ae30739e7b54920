# Run by `cmake --install` (install(CODE) in MeshInstall.cmake): installs the
# systemd unit MESH_UNIT_SOURCE as MESH_UNIT_DIR/MESH_UNIT_NAME under the
# prefix being installed to, with ExecStart and Documentation naming that
# prefix's binaries and documents (the sources say /usr/local).
set(prefix "${CMAKE_INSTALL_PREFIX}")
file(READ "${MESH_UNIT_SOURCE}" text)
string(REPLACE "/usr/local/bin/" "${prefix}/${MESH_BINDIR}/" text "${text}")
string(REPLACE "file:///usr/local/share/doc/mesh/" "file://${prefix}/${MESH_DOCDIR}/" text
       "${text}")
set(dest "$ENV{DESTDIR}${prefix}/${MESH_UNIT_DIR}/${MESH_UNIT_NAME}")
message(STATUS "Installing: ${dest}")
file(WRITE "${dest}" "${text}")
list(APPEND CMAKE_INSTALL_MANIFEST_FILES "${dest}")
