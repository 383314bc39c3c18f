# `cmake --install BUILD --prefix P` (docs/api.md#installing): the public headers (include/tessera and the generated
# tessera/version.h), the libraries, the tools, and a relocatable CMake package (P/lib/cmake/Tessera) exporting
# Tessera::tessera, Tessera::planner_model and Tessera::planner. The internal headers under src/include are not
# installed.
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tessera DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/include/tessera/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tessera)
install(TARGETS tessera tessera_planner_model tessera_planner EXPORT TesseraTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
set_target_properties(tessera PROPERTIES EXPORT_NAME tessera)
set_target_properties(tessera_planner_model PROPERTIES EXPORT_NAME planner_model)
set_target_properties(tessera_planner PROPERTIES EXPORT_NAME planner)
install(TARGETS train eval convert generate plan convert_text_to_mds train_tokenizer
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera)
install(EXPORT TesseraTargets NAMESPACE Tessera:: DESTINATION ${_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/TesseraConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/TesseraConfig.cmake INSTALL_DESTINATION ${_cmake_dir})
# 0.x: a consumer asking for 0.1 accepts 0.1.y only (SameMinorVersion); from 1.0 on, SameMajorVersion.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/TesseraConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/TesseraConfig.cmake ${PROJECT_BINARY_DIR}/TesseraConfigVersion.cmake
        DESTINATION ${_cmake_dir})
