# The CMake package of libmesh (component "dev", with the header):
#   find_package(rdmamesh 0.1 CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE rdmamesh::mesh)
# Relocatable: every path in it is relative to where it is installed, so `cmake --install build
# --prefix DIR` gives a package that works from DIR (CMAKE_PREFIX_PATH=DIR).
include(CMakePackageConfigHelpers)

set(MESH_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/rdmamesh)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/rdmamesh-config.cmake.in
                              ${PROJECT_BINARY_DIR}/rdmamesh-config.cmake
                              INSTALL_DESTINATION ${MESH_CMAKE_DIR})
# The soname's major version is the compatibility: 0.x asks for the same major, like libmesh.so.0.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/rdmamesh-config-version.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(EXPORT rdmamesh-targets NAMESPACE rdmamesh:: DESTINATION ${MESH_CMAKE_DIR} COMPONENT dev)
install(FILES ${PROJECT_BINARY_DIR}/rdmamesh-config.cmake ${PROJECT_BINARY_DIR}/rdmamesh-config-version.cmake
        DESTINATION ${MESH_CMAKE_DIR} COMPONENT dev)
