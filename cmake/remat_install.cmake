# `cmake --install` and the CMake package: headers, libraries and remat-config.cmake with the
# exported targets, so that a project outside this tree can
#
#   find_package(remat 0.1 CONFIG REQUIRED)
#   target_link_libraries(my_loop PRIVATE remat::driver remat::ops)
#
# with C++20 and every include directory carried by the targets. `cpack -G DEB` packages the
# same install tree for Debian (tests/consumer builds against an installed copy in CI).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(REMAT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/remat)

# The installed targets and the names they are exported under (remat::<name>).
set(remat_exported
  remat_ir ir
  remat_alloc alloc
  remat_cuda cuda
  remat_core core
  remat_steps steps
  remat_trace trace
  remat_runtime remat
  remat_kernels_cpu kernels_cpu
  remat_ops ops
  remat_planner planner
  remat_driver driver)
if(TARGET remat_kernels_cuda)
  list(APPEND remat_exported remat_kernels_cuda kernels_cuda)
endif()

set(remat_install_targets)
list(LENGTH remat_exported n)
math(EXPR last "${n} - 1")
foreach(i RANGE 0 ${last} 2)
  math(EXPR j "${i} + 1")
  list(GET remat_exported ${i} target)
  list(GET remat_exported ${j} name)
  if(TARGET ${target})
    set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
    target_include_directories(${target} INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
    list(APPEND remat_install_targets ${target})
  endif()
endforeach()

install(TARGETS ${remat_install_targets} EXPORT remat-targets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/remat DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
# The op library's headers, as the examples include them ("kernels/ops.h").
install(FILES ${PROJECT_SOURCE_DIR}/kernels/ops.h ${PROJECT_SOURCE_DIR}/kernels/autograd.h
  ${PROJECT_SOURCE_DIR}/kernels/philox.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kernels)
# The command-line tools.
foreach(tool remat-plan remat-replay remat-compare)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

install(EXPORT remat-targets NAMESPACE remat:: DESTINATION ${REMAT_INSTALL_CMAKEDIR})
set(REMAT_CONFIG_HAVE_CUDA ${REMAT_HAVE_CUDA})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/remat-config.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/remat-config.cmake INSTALL_DESTINATION ${REMAT_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/remat-config-version.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/remat-config.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/remat-config-version.cmake DESTINATION ${REMAT_INSTALL_CMAKEDIR})

# Debian package: cpack -G DEB (from the build directory).
set(CPACK_PACKAGE_NAME remat-dev)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "remat developers <remat@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "Dynamic tensor rematerialization runtime and offline planner for C++/CUDA training loops")
set(CPACK_DEBIAN_PACKAGE_DEPENDS
  "libabsl-dev, nlohmann-json3-dev, libopenblas-dev, coinor-libcbc-dev, libgecode-dev, libboost-dev")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_GENERATOR DEB)
include(CPack)
