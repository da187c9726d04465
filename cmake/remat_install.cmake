# `cmake --install` and the CMake package: headers, libraries and remat-config.cmake with the
# exported targets, one export set per component, so that a project outside this tree can
#
#   find_package(remat 0.1 CONFIG REQUIRED)                       # the core: remat::remat
#   find_package(remat 0.1 CONFIG REQUIRED COMPONENTS driver ops)  # and what it asks for
#   target_link_libraries(my_loop PRIVATE remat::driver remat::ops)
#
# with C++20 and every include directory carried by the targets. The core needs abseil and
# nothing else: no CUDA toolkit (libcudart is opened at run time), no solver, no Boost. The
# components and what each makes the package look for:
#   ops      remat::ops, remat::kernels_cpu (OpenBLAS, by path); in a CUDA build also cuda
#   cuda     remat::kernels_cuda (CUDAToolkit: cudart, cuBLAS)
#   planner  remat::planner (CBC through pkg-config; Gecode by path)
#   driver   remat::driver (needs planner)
#   torch    remat::torch, the PyTorch device (remat/torch.h), over the LibTorch of the torch
#            this build found (remat::libtorch, by path); its Python module remat_torch is in
#            lib/remat/python
#   mpi      remat::collectives_mpi, the collectives over MPI (remat/mpi_collectives.h; MPI)
#   nccl     remat::collectives_nccl, over NCCL on device memory (remat/nccl_collectives.h;
#            CUDAToolkit; libnccl opened at run time)
# `cpack -G DEB` packages the same install tree for Debian (tests/consumer and
# tests/consumer_core build against an installed copy in CI).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(REMAT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/remat)

# Each component: its export set's name, then pairs of installed target and the name it is
# exported under (remat::<name>).
set(remat_component_core
  remat_ir ir remat_alloc alloc remat_cuda cuda remat_core core remat_steps steps
  remat_trace trace remat_runtime remat remat_collectives collectives)
set(remat_component_ops remat_kernels_cpu kernels_cpu remat_ops ops)
set(remat_component_cuda remat_kernels_cuda kernels_cuda)
set(remat_component_planner remat_planner planner)
set(remat_component_driver remat_driver driver)
set(remat_component_torch remat_libtorch libtorch remat_torch torch)
set(remat_component_mpi remat_collectives_mpi collectives_mpi)
set(remat_component_nccl remat_collectives_nccl collectives_nccl)

# Installs the targets of component `component` that this build has, as export set
# remat-<component>-targets; appends the component to REMAT_INSTALLED_COMPONENTS.
function(remat_install_component component)
  set(pairs ${remat_component_${component}})
  list(LENGTH pairs n)
  math(EXPR last "${n} - 1")
  set(targets)
  foreach(i RANGE 0 ${last} 2)
    math(EXPR j "${i} + 1")
    list(GET pairs ${i} target)
    list(GET pairs ${j} name)
    if(TARGET ${target})
      set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
      target_include_directories(${target} INTERFACE
        $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
      list(APPEND targets ${target})
    endif()
  endforeach()
  if(NOT targets)
    return()
  endif()
  install(TARGETS ${targets} EXPORT remat-${component}-targets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(EXPORT remat-${component}-targets NAMESPACE remat::
    DESTINATION ${REMAT_INSTALL_CMAKEDIR})
  set(REMAT_INSTALLED_COMPONENTS ${REMAT_INSTALLED_COMPONENTS} ${component} PARENT_SCOPE)
endfunction()

set(REMAT_INSTALLED_COMPONENTS)
foreach(component core cuda ops planner driver torch mpi nccl)
  remat_install_component(${component})
endforeach()

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

# What the config file knows of this build: the components it installed, and whether ops
# carries the CUDA kernels (and so needs the cuda component).
list(REMOVE_ITEM REMAT_INSTALLED_COMPONENTS core)
set(REMAT_CONFIG_COMPONENTS ${REMAT_INSTALLED_COMPONENTS})
set(REMAT_CONFIG_OPS_NEED_CUDA OFF)
if(TARGET remat_kernels_cuda AND TARGET remat_ops)
  set(REMAT_CONFIG_OPS_NEED_CUDA ON)
endif()
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
# The core needs abseil alone; the components' libraries are recommended, not required.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libabsl-dev")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libopenblas-dev, coinor-libcbc-dev, libgecode-dev")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_GENERATOR DEB)
include(CPack)
