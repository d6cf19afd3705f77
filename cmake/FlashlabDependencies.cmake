# Finds libtorch (from the pip torch wheel), cuRAND, GoogleTest and Google
# Benchmark the same way on a machine with a system CUDA toolkit and on one
# where cuRAND only comes with the nvidia pip wheels.

find_package(CUDAToolkit REQUIRED)

# The Python that holds torch: the one building the wheel under scikit-build-core
# (pip install .), else the project's .venv when present, else python3.
if(NOT FLASHLAB_PYTHON)
  if(DEFINED SKBUILD AND Python_EXECUTABLE)
    set(_python "${Python_EXECUTABLE}")
  elseif(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(_python "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  else()
    find_program(_python NAMES python3 python REQUIRED)
  endif()
  set(FLASHLAB_PYTHON "${_python}" CACHE FILEPATH "Python interpreter whose torch provides libtorch")
endif()

execute_process(
  COMMAND "${FLASHLAB_PYTHON}" -W ignore -c
          "import os, torch; print(torch.utils.cmake_prefix_path); print(os.path.dirname(os.path.dirname(torch.__file__))); print(torch.__version__)"
  OUTPUT_VARIABLE _torch_info
  RESULT_VARIABLE _torch_result
  ERROR_VARIABLE _torch_error
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_result EQUAL 0)
  message(FATAL_ERROR "flashlab needs torch in ${FLASHLAB_PYTHON} (run scripts/setup.sh): ${_torch_error}")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 _torch_cmake_prefix)
list(GET _torch_info 1 FLASHLAB_SITE_PACKAGES)
list(GET _torch_info 2 FLASHLAB_TORCH_VERSION)
list(APPEND CMAKE_PREFIX_PATH "${_torch_cmake_prefix}")
message(STATUS "flashlab: torch ${FLASHLAB_TORCH_VERSION} from ${FLASHLAB_PYTHON}")

# torch's config wants the old FindCUDA root and appends -gencode flags for every
# arch in TORCH_CUDA_ARCH_LIST (whose default includes compute_50, which nvcc 13
# rejects) to the global CMAKE_CUDA_FLAGS. Our kernels set their own
# architectures, so keep torch's CUDA flags out of them.
get_filename_component(CUDA_TOOLKIT_ROOT_DIR "${CUDAToolkit_BIN_DIR}" DIRECTORY)
set(TORCH_CUDA_ARCH_LIST "8.0;9.0a")
set(_flashlab_saved_cuda_flags "${CMAKE_CUDA_FLAGS}")
find_package(Torch REQUIRED)
set(CMAKE_CUDA_FLAGS "${_flashlab_saved_cuda_flags}")

# cuRAND: the toolkit's when it has one, else the nvidia-curand wheel's, which
# ships only versioned library names (libcurand.so.10).
add_library(flashlab_curand INTERFACE)
if(TARGET CUDA::curand)
  target_link_libraries(flashlab_curand INTERFACE CUDA::curand)
  message(STATUS "flashlab: cuRAND from the CUDA toolkit")
else()
  set(_wheel_root "${FLASHLAB_SITE_PACKAGES}/nvidia/cu13")
  file(GLOB _curand_libraries "${_wheel_root}/lib/libcurand.so*")
  if(NOT _curand_libraries OR NOT EXISTS "${_wheel_root}/include/curand.h")
    message(FATAL_ERROR "cuRAND not found in the CUDA toolkit (${CUDAToolkit_LIBRARY_DIR}) "
                        "nor in the nvidia-curand wheel (${_wheel_root})")
  endif()
  list(GET _curand_libraries 0 _curand_library)
  target_include_directories(flashlab_curand SYSTEM INTERFACE "${_wheel_root}/include")
  target_link_libraries(flashlab_curand INTERFACE "${_curand_library}")
  message(STATUS "flashlab: cuRAND from the wheel: ${_curand_library}")
endif()

if(FLASHLAB_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(FLASHLAB_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()
