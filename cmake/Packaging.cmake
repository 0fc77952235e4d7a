# Debian packages with CPack, one per install component:
#   rdmamesh     (runtime) meshd, meshctl, meshcat, meshecho, meshbench, the unit, sysusers.d, man pages
#   libmesh0     (lib)     libmesh.so.0 and its real file
#   libmesh-dev  (dev)     mesh/mesh.h, libmesh.so, mesh.pc, the CMake package, libmesh(3)
# Built from a build configured for it (README, "Install"):
#   cmake -S . -B build-deb -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr -DMESH_PACKAGE_DEB=ON
#   cmake --build build-deb && (cd build-deb && cpack -G DEB)
# The dependencies on other packages come from dpkg-shlibdeps; tests/install/deb_test.sh installs the
# packages, runs them, purges them and runs lintian.
option(MESH_PACKAGE_DEB "Install the files Debian wants in each package (copyright, changelog) for cpack -G DEB" OFF)
set(MESH_DEB_MAINTAINER "rdmamesh maintainers <rdmamesh@example.org>" CACHE STRING
    "Maintainer of the Debian packages (Name <address>)")
set(MESH_DEB_RELEASE 1 CACHE STRING "Debian revision of the packages")
set(MESH_DEB_VERSION "${PROJECT_VERSION}-${MESH_DEB_RELEASE}")
set(MESH_DEB_PACKAGES rdmamesh libmesh0 libmesh-dev)
set(MESH_DEB_COMPONENTS runtime lib dev)

if(MESH_PACKAGE_DEB)
  if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
    message(FATAL_ERROR "MESH_PACKAGE_DEB: Debian packages install under /usr; configure with -DCMAKE_INSTALL_PREFIX=/usr "
                        "(the unit's ExecStart and the library's path are made from the prefix)")
  endif()
  # Every package carries /usr/share/doc/<package>/copyright and changelog.Debian.gz (gzip -9n, the
  # date from SOURCE_DATE_EPOCH when set, so the bytes are reproducible).
  find_program(GZIP gzip REQUIRED)
  string(TIMESTAMP MESH_DEB_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
  configure_file(${PROJECT_SOURCE_DIR}/deploy/debian/changelog.in ${PROJECT_BINARY_DIR}/debian/changelog @ONLY)
  execute_process(COMMAND ${GZIP} -9nc ${PROJECT_BINARY_DIR}/debian/changelog
                  OUTPUT_FILE ${PROJECT_BINARY_DIR}/debian/changelog.Debian.gz COMMAND_ERROR_IS_FATAL ANY)
  foreach(package component IN ZIP_LISTS MESH_DEB_PACKAGES MESH_DEB_COMPONENTS)
    install(FILES ${PROJECT_SOURCE_DIR}/deploy/debian/copyright ${PROJECT_BINARY_DIR}/debian/changelog.Debian.gz
            DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${package} COMPONENT ${component})
  endforeach()
endif()

set(CPACK_PACKAGE_NAME rdmamesh)
set(CPACK_PACKAGE_VENDOR "rdmamesh")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${MESH_DEB_MAINTAINER}")
set(CPACK_COMPONENTS_ALL ${MESH_DEB_COMPONENTS})
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE ${MESH_DEB_RELEASE})
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${MESH_DEB_MAINTAINER}")
# Dependencies from the binaries (dpkg-shlibdeps); libmesh.so.0 is ours, found in the build tree and
# named explicitly below with the exact version (the tools and the header must match the library).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/meshlib)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS OFF)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME rdmamesh)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION net)
# meshd opens libsystemd and libmicrohttpd itself (util_dl_load), which dpkg-shlibdeps cannot see:
# named here, by Debian's rule for a library's package name (libfoo.so.N: libfooN).
set(MESH_DEB_DLOPEN_DEPENDS "")
foreach(soname ${MESH_SYSTEMD_SONAME} ${MESH_MHD_SONAME})
  string(REGEX REPLACE "^(.*)\\.so\\.([0-9]+)$" "\\1\\2" pkg "${soname}")
  string(APPEND MESH_DEB_DLOPEN_DEPENDS ", ${pkg}")
endforeach()
set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS "libmesh0 (= ${MESH_DEB_VERSION})${MESH_DEB_DLOPEN_DEPENDS}")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/deploy/debian/postinst ${PROJECT_SOURCE_DIR}/deploy/debian/postrm)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
    "RDMA messaging mesh: daemon and tools
meshd keeps a full mesh of reliable-connected RDMA queue pairs (or TCP
connections) between the nodes of a cluster and carries stream channels
between applications on them. meshctl shows links, channels and counters;
meshcat, meshecho and meshbench are example tools. Includes the systemd unit
meshd@.service (one instance per node id) and the rdmamesh group.")

set(CPACK_DEBIAN_LIB_PACKAGE_NAME libmesh0)
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
# ldconfig by trigger, not by maintainer script.
set(CPACK_DEBIAN_LIB_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/deploy/debian/triggers)
set(CPACK_COMPONENT_LIB_DESCRIPTION
    "RDMA messaging mesh: client library
libmesh opens stream channels to applications on other nodes of an rdmamesh
cluster through the local meshd; the bytes travel through shared-memory rings
and RDMA writes.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libmesh-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libmesh0 (= ${MESH_DEB_VERSION})")
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "RDMA messaging mesh: client library, development files
The header mesh/mesh.h, the libmesh.so link, pkg-config's mesh.pc and the
CMake package rdmamesh (find_package(rdmamesh CONFIG), target rdmamesh::mesh),
and the manual page libmesh(3).")

# cpack -G DEB refuses a build that was not configured for it (the changelog and copyright files).
set(CPACK_MESH_PACKAGE_DEB ${MESH_PACKAGE_DEB})
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_BINARY_DIR}/CPackProjectConfig.cmake)
file(WRITE ${PROJECT_BINARY_DIR}/CPackProjectConfig.cmake "
if(CPACK_GENERATOR STREQUAL \"DEB\" AND NOT CPACK_MESH_PACKAGE_DEB)
  message(FATAL_ERROR \"cpack -G DEB: configure this build with -DCMAKE_INSTALL_PREFIX=/usr -DMESH_PACKAGE_DEB=ON\")
endif()
")
include(CPack)
