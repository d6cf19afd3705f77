# cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DCONSUMER_SOURCE_DIR=... -DPYTHON=...
#       -DGENERATOR=... -DMAKE_PROGRAM=... -DCXX_COMPILER=... -DCUDA_TOOLKIT_ROOT=...
#       -DBUILD_TYPE=... -P TestInstalledPackage.cmake
# The C++ package end to end, as a user would take it: installs the build tree's
# flashlab_cpp component into WORK_DIR/prefix, checks what was installed (the public
# headers and no harness header, no path into the source or build tree), configures
# and builds CONSUMER_SOURCE_DIR against it with CMAKE_PREFIX_PATH = the prefix and
# torch's cmake_prefix_path, and runs the consumer's CPU part (--list-kernels). The
# consumer's GPU comparison is the test cpp_package_consumer_gpu.

foreach(variable BUILD_DIR SOURCE_DIR WORK_DIR CONSUMER_SOURCE_DIR PYTHON GENERATOR CXX_COMPILER
                 CUDA_TOOLKIT_ROOT)
  if("${${variable}}" STREQUAL "")
    message(FATAL_ERROR "TestInstalledPackage.cmake needs -D${variable}=...")
  endif()
endforeach()

# Reports a command's result; on failure prints its output and stops.
function(check_step name result output seconds)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${name} failed (exit ${result}):\n${output}")
  endif()
  message("${name}: ok (${seconds} s)")
endfunction()

# Runs one command (its arguments may not hold a ';').
function(run_step name)
  string(TIMESTAMP start "%s")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  string(TIMESTAMP stop "%s")
  math(EXPR seconds "${stop} - ${start}")
  check_step("${name}" "${result}" "${output}" "${seconds}")
  set(step_output "${output}" PARENT_SCOPE)
endfunction()

set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")

run_step("install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" --component flashlab_cpp)

foreach(header attention.h kernel_params.h kernel_registry.h cuda_check.h)
  if(NOT EXISTS "${prefix}/include/flashlab/${header}")
    message(FATAL_ERROR "not installed: include/flashlab/${header}")
  endif()
endforeach()
if(EXISTS "${prefix}/include/flashlab/harness")
  message(FATAL_ERROR "the harness's headers were installed: ${prefix}/include/flashlab/harness")
endif()
file(GLOB_RECURSE package_files "${prefix}/*.cmake")
if(NOT package_files)
  message(FATAL_ERROR "no CMake package files under ${prefix}")
endif()
foreach(file IN LISTS package_files)
  file(READ "${file}" text)
  foreach(tree "${BUILD_DIR}" "${SOURCE_DIR}")
    string(FIND "${text}" "${tree}" found)
    if(NOT found EQUAL -1)
      message(FATAL_ERROR "${file} names a path in ${tree}: the package is not relocatable")
    endif()
  endforeach()
endforeach()

execute_process(COMMAND "${PYTHON}" -W ignore -c "import torch; print(torch.utils.cmake_prefix_path)"
                RESULT_VARIABLE result OUTPUT_VARIABLE torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${PYTHON} could not import torch")
endif()

set(generator_options -G "${GENERATOR}")
if(MAKE_PROGRAM)
  list(APPEND generator_options "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(BUILD_TYPE)
  list(APPEND generator_options "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
endif()
# CMAKE_PREFIX_PATH holds a ';': this command is not passed through run_step's ARGN.
string(TIMESTAMP start "%s")
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build" ${generator_options}
                        "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCUDAToolkit_ROOT=${CUDA_TOOLKIT_ROOT}"
                        "-DCMAKE_PREFIX_PATH=${prefix};${torch_prefix}"
                RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
string(TIMESTAMP stop "%s")
math(EXPR seconds "${stop} - ${start}")
check_step("configure examples/cpp_consumer" "${result}" "${output}" "${seconds}")
run_step("build examples/cpp_consumer" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run_step("run flashlab_consumer --list-kernels" "${WORK_DIR}/build/flashlab_consumer" --list-kernels)
message("${step_output}")
if(NOT step_output MATCHES "registered kernels: [a-z]")
  message(FATAL_ERROR "expected flashlab_consumer to list the registered kernels")
endif()
