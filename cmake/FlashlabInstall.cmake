# The C++ package: `cmake --install <build> --prefix <dir>` installs the public op
# library for find_package(flashlab CONFIG) and flashlab::flashlab:
#
#   <dir>/include/flashlab/*.h                 attention.h, kernel_params.h, kernel_registry.h,
#                                              cuda_check.h (not include/flashlab/harness/)
#   <dir>/lib/libflashlab.a                    the op library with its kernels folded in
#   <dir>/lib/cmake/flashlab/                  flashlabConfig.cmake, flashlabConfigVersion.cmake,
#                                              flashlabTargets*.cmake
#
# Everything installs in the component `flashlab_cpp` (cmake --install ... --component
# flashlab_cpp installs only this). The harness, the tools, the developer kernels and
# the tests stay in the tree.
#
# Why one archive. In the tree `flashlab` is a static library that links the kernel
# libraries (flashlab_kernels_sm80, flashlab_kernels_sm90a) and flashlab_kernel_runtime,
# themselves static. Installing them as they are would export four libraries and the
# in-tree helper targets (flashlab_kernel_common) as flashlab::flashlab's link-only
# dependencies, and would need the in-tree targets' include paths rewritten for the
# install tree. Instead the installed libflashlab.a is a separate archive target,
# flashlab_package (exported as flashlab::flashlab), whose members are the object files
# of `flashlab` and of every in-tree static library it links, found by walking its link
# libraries: a consumer sees one library whose usage requirements are only the public
# headers, torch and the CUDA runtime. The in-tree targets are not changed; the extra
# archive costs one `ar` of objects already built.
#
# Device code: the kernel libraries are compiled whole-program (no
# CUDA_SEPARABLE_COMPILATION, no -rdc): each object carries its own fatbinary, so the
# consumer's executable needs no device-link step; the check below fails the configure
# if that ever changes, since the folded archive would then also need the device-link
# object.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FLASHLAB_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/flashlab" CACHE STRING
    "Where flashlabConfig.cmake installs, relative to the install prefix")

# Walks `target`'s link libraries: the object files of every in-tree static library
# reached go to objects_var, every external dependency (imported targets such as torch
# and CUDA::cudart) to deps_var.
function(flashlab_collect_package_parts target objects_var deps_var)
  set(pending "${target}")
  set(visited)
  set(objects)
  set(deps)
  while(pending)
    list(POP_FRONT pending current)
    if(current IN_LIST visited)
      continue()
    endif()
    list(APPEND visited "${current}")
    get_target_property(type ${current} TYPE)
    get_target_property(imported ${current} IMPORTED)
    if(imported)
      list(APPEND deps "${current}")
      continue()
    endif()
    if(type STREQUAL "STATIC_LIBRARY")
      foreach(property CUDA_SEPARABLE_COMPILATION CUDA_RESOLVE_DEVICE_SYMBOLS)
        get_target_property(value ${current} ${property})
        if(value)
          message(FATAL_ERROR "flashlab package: ${current} sets ${property}; the folded libflashlab.a "
                              "would need a device-link step (cmake/FlashlabInstall.cmake)")
        endif()
      endforeach()
      list(APPEND objects "$<TARGET_OBJECTS:${current}>")
      get_target_property(links ${current} LINK_LIBRARIES)
    elseif(type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(links ${current} INTERFACE_LINK_LIBRARIES)
    else()
      message(FATAL_ERROR "flashlab package: ${target} links ${current}, a ${type}; "
                          "only static and interface libraries fold into libflashlab.a")
    endif()
    foreach(link IN LISTS links)
      if(link MATCHES "^\\$<LINK_ONLY:([^>]+)>$")
        set(link "${CMAKE_MATCH_1}")
      endif()
      if(link MATCHES "\\$<")
        message(FATAL_ERROR "flashlab package: ${current} links '${link}', a generator expression "
                            "cmake/FlashlabInstall.cmake does not know how to fold")
      elseif(TARGET "${link}")
        list(APPEND pending "${link}")
      elseif(link)
        list(APPEND deps "${link}")  # a plain library name or path
      endif()
    endforeach()
  endwhile()
  list(REMOVE_DUPLICATES deps)
  set(${objects_var} ${objects} PARENT_SCOPE)
  set(${deps_var} ${deps} PARENT_SCOPE)
endfunction()

flashlab_collect_package_parts(flashlab _flashlab_package_objects _flashlab_package_deps)
foreach(dep IN LISTS _flashlab_package_deps)
  if(NOT dep MATCHES "^(torch|CUDA::cudart)$")
    # The config file finds Torch and CUDAToolkit only; a new external dependency
    # needs its find_dependency() there.
    message(FATAL_ERROR "flashlab package: the op library now links '${dep}'; "
                        "add it to cmake/flashlabConfig.cmake.in and this list")
  endif()
endforeach()

add_library(flashlab_package STATIC ${_flashlab_package_objects})
set_target_properties(flashlab_package PROPERTIES
  OUTPUT_NAME flashlab
  EXPORT_NAME flashlab
  ARCHIVE_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/package"
  LINKER_LANGUAGE CXX)
target_include_directories(flashlab_package INTERFACE
  "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>"
  "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
# torch 2.14's headers need C++20.
target_compile_features(flashlab_package INTERFACE cxx_std_20)
target_link_libraries(flashlab_package INTERFACE ${_flashlab_package_deps})

install(TARGETS flashlab_package EXPORT flashlabTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT flashlab_cpp)
# The public headers: include/flashlab/*.h; the harness's headers stay in the tree.
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/flashlab" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        COMPONENT flashlab_cpp
        FILES_MATCHING PATTERN "*.h"
        PATTERN "harness" EXCLUDE)
install(EXPORT flashlabTargets NAMESPACE flashlab:: DESTINATION "${FLASHLAB_INSTALL_CMAKEDIR}"
        COMPONENT flashlab_cpp)

# The torch version the library was built against: libtorch has no stable C++ ABI,
# so the config asks for the same major.minor.
string(REGEX MATCH "^[0-9]+\\.[0-9]+" FLASHLAB_TORCH_MAJOR_MINOR "${FLASHLAB_TORCH_VERSION}")
string(REPLACE "." "\\\\." FLASHLAB_TORCH_MAJOR_MINOR_REGEX "${FLASHLAB_TORCH_MAJOR_MINOR}")
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/flashlabConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/package/flashlabConfig.cmake"
  INSTALL_DESTINATION "${FLASHLAB_INSTALL_CMAKEDIR}")
# 0.x: a minor version may change the API.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/package/flashlabConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/package/flashlabConfig.cmake"
              "${PROJECT_BINARY_DIR}/package/flashlabConfigVersion.cmake"
        DESTINATION "${FLASHLAB_INSTALL_CMAKEDIR}" COMPONENT flashlab_cpp)

# The test: install this build into a prefix under the build tree, build
# examples/cpp_consumer against it the way the README says, run its CPU part
# (label cpu); the consumer's GPU comparison is a second test (label gpu, exit 77
# without a GPU: skipped) that needs the first one's executable.
if(FLASHLAB_BUILD_TESTS)
  set(_consumer_dir "${PROJECT_BINARY_DIR}/cpp_consumer")
  get_filename_component(_cuda_toolkit_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  add_test(NAME cpp_package_consumer_builds
           COMMAND "${CMAKE_COMMAND}"
                   "-DBUILD_DIR=${PROJECT_BINARY_DIR}"
                   "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}"
                   "-DWORK_DIR=${_consumer_dir}"
                   "-DCONSUMER_SOURCE_DIR=${PROJECT_SOURCE_DIR}/examples/cpp_consumer"
                   "-DPYTHON=${FLASHLAB_PYTHON}"
                   "-DGENERATOR=${CMAKE_GENERATOR}"
                   "-DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}"
                   "-DCXX_COMPILER=${CMAKE_CXX_COMPILER}"
                   "-DCUDA_TOOLKIT_ROOT=${_cuda_toolkit_root}"
                   "-DBUILD_TYPE=${CMAKE_BUILD_TYPE}"
                   -P "${PROJECT_SOURCE_DIR}/cmake/TestInstalledPackage.cmake")
  set_tests_properties(cpp_package_consumer_builds PROPERTIES
    LABELS cpu TIMEOUT 900 FIXTURES_SETUP flashlab_cpp_consumer)
  add_test(NAME cpp_package_consumer_gpu COMMAND "${_consumer_dir}/build/flashlab_consumer")
  set_tests_properties(cpp_package_consumer_gpu PROPERTIES
    LABELS gpu TIMEOUT 600 SKIP_RETURN_CODE 77 FIXTURES_REQUIRED flashlab_cpp_consumer)
endif()
