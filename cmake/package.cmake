# The version header, the umbrella target and everything `cmake --install` puts in a
# prefix: public headers, the layer libraries (static), the npurt command, a CMake
# package (find_package(npurt) -> npurt::npurt, npurt::base, ...) and npurt.pc.
# Included from the top-level CMakeLists.txt after the layers are defined.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# npurt/version.h, from project(VERSION ...): the one place the version is written.
set(NPURT_GENERATED_INCLUDE_DIR ${PROJECT_BINARY_DIR}/include)
configure_file(${CMAKE_CURRENT_LIST_DIR}/version.h.in ${NPURT_GENERATED_INCLUDE_DIR}/npurt/version.h @ONLY)

# Every layer library, in the order npurt_library defined them (dependencies first).
get_property(NPURT_LAYER_LIBRARIES GLOBAL PROPERTY NPURT_LAYER_LIBRARIES)

# npurt::npurt: every layer library, plus the generated headers.
add_library(npurt_umbrella INTERFACE)
set_target_properties(npurt_umbrella PROPERTIES EXPORT_NAME npurt)
target_link_libraries(npurt_umbrella INTERFACE ${NPURT_LAYER_LIBRARIES})
target_include_directories(npurt_umbrella INTERFACE $<BUILD_INTERFACE:${NPURT_GENERATED_INCLUDE_DIR}>)
add_library(npurt::npurt ALIAS npurt_umbrella)

set(NPURT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/npurt)

# comm/mpi.h goes with npurt_mpi, which is not installed (programs that do not use MPI
# should neither link nor need it).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/npurt ${NPURT_GENERATED_INCLUDE_DIR}/npurt
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT Development
        FILES_MATCHING PATTERN "*.h" PATTERN "mpi.h" EXCLUDE)
install(TARGETS ${NPURT_LAYER_LIBRARIES} npurt_umbrella EXPORT npurt-targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Development
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET npurt)
  install(TARGETS npurt RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT Runtime)
endif()

install(EXPORT npurt-targets NAMESPACE npurt:: DESTINATION ${NPURT_CMAKE_DIR} COMPONENT Development)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/npurt-config.cmake.in
                              ${PROJECT_BINARY_DIR}/npurt-config.cmake
                              INSTALL_DESTINATION ${NPURT_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/npurt-config-version.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/npurt-config.cmake ${PROJECT_BINARY_DIR}/npurt-config-version.cmake
        DESTINATION ${NPURT_CMAKE_DIR} COMPONENT Development)

# npurt.pc, relocatable: the prefix is found from the file's own place.
set(NPURT_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH NPURT_PC_TO_PREFIX /prefix/${NPURT_PC_DIR} /prefix)
string(REGEX REPLACE "/$" "" NPURT_PC_TO_PREFIX "${NPURT_PC_TO_PREFIX}")
# Static libraries: every layer in link order (users before what they use).
set(NPURT_PC_LIBS "")
foreach(lib IN LISTS NPURT_LAYER_LIBRARIES)
  string(PREPEND NPURT_PC_LIBS "-l${lib} ")
endforeach()
string(STRIP "${NPURT_PC_LIBS}" NPURT_PC_LIBS)
configure_file(${CMAKE_CURRENT_LIST_DIR}/npurt.pc.in ${PROJECT_BINARY_DIR}/npurt.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/npurt.pc DESTINATION ${NPURT_PC_DIR} COMPONENT Development)
