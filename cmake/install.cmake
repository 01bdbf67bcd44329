# Install rules: `cmake --install <build> --prefix P` gives
#   P/include/pdx/*.h                      public headers (one tree)
#   P/<libdir>/libpdx.so.<ver>, .so.0, .so libpdx (SONAME libpdx.so.0)
#   P/<libdir>/pdx/libpdx_backend_*.so, libpdx_store_*.so   modules, where
#                                          libpdx.so looks for them
#   P/bin/pdx-info, pdx-hash, pdx-bench, pdx-validate, glm52-pd-node
#   P/share/pdx/configs/                   deployment configs (pdx-validate)
#   P/<libdir>/pkgconfig/pdx.pc            pkg-config
#   P/<libdir>/cmake/pdx/                  find_package(pdx): pdx::pdx
# SONAME policy: libpdx.so.0 stays the SONAME while the ABI only grows
# (pdx_plugin_v1 and the param structs are append-only, checked by
# tests/lib/test_dlopen.c); an incompatible change bumps it. The file version follows
# the project version.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(PDX_INSTALL_MODULEDIR ${CMAKE_INSTALL_LIBDIR}/pdx)
set(PDX_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/pdx)

# Installed programs find libpdx.so relative to themselves; modules find it
# in the directory above theirs (it is loaded first anyway).
file(RELATIVE_PATH _pdx_bin_to_lib
     ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}
     ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR})
set(PDX_BIN_RPATH "$ORIGIN/${_pdx_bin_to_lib}")

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/pdx
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")

install(TARGETS pdx EXPORT pdxTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

foreach(m pdx_backend_ucx pdx_backend_cma pdx_backend_cuda_ipc
          pdx_store_etcd)
  if(TARGET ${m})
    set_target_properties(${m} PROPERTIES INSTALL_RPATH "$ORIGIN/..")
    install(TARGETS ${m} LIBRARY DESTINATION ${PDX_INSTALL_MODULEDIR})
  endif()
endforeach()

foreach(t pdx-info pdx-hash pdx-bench pdx-validate glm52-pd-node)
  if(TARGET ${t})
    set_target_properties(${t} PROPERTIES INSTALL_RPATH "${PDX_BIN_RPATH}")
    install(TARGETS ${t} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

install(DIRECTORY ${PROJECT_SOURCE_DIR}/configs/
        DESTINATION ${CMAKE_INSTALL_DATADIR}/pdx/configs)

# pkg-config: paths relative to the .pc file's prefix (relocatable).
file(RELATIVE_PATH PDX_PC_UP
     ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig
     ${CMAKE_INSTALL_PREFIX})
configure_file(${PROJECT_SOURCE_DIR}/cmake/pdx.pc.in
               ${CMAKE_BINARY_DIR}/pdx.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/pdx.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# CMake package: pdx::pdx (imported shared library with its include dir).
install(EXPORT pdxTargets NAMESPACE pdx:: DESTINATION ${PDX_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/pdxConfig.cmake.in
  ${CMAKE_BINARY_DIR}/pdxConfig.cmake
  INSTALL_DESTINATION ${PDX_INSTALL_CMAKEDIR}
  PATH_VARS PDX_INSTALL_MODULEDIR)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/pdxConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/pdxConfig.cmake
              ${CMAKE_BINARY_DIR}/pdxConfigVersion.cmake
        DESTINATION ${PDX_INSTALL_CMAKEDIR})
