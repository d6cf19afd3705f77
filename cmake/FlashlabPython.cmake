# The Python package (src/python/flashlab) and its extension, libflashlab_ops.so
# (src/python/flashlab_ops.cpp): the C++ API as torch operators, registered with
# TORCH_LIBRARY and loaded by the package with torch.ops.load_library, so it needs
# no Python headers and no pybind11. Built in the normal build (make test runs
# pytest against the build tree) and by scikit-build-core (pyproject.toml), which
# builds the target flashlab_ops only and installs the component "python": the
# extension here, the Python sources through wheel.packages.
option(FLASHLAB_BUILD_PYTHON "Build the flashlab Python package's extension (libflashlab_ops.so)" ON)

if(FLASHLAB_BUILD_PYTHON)
  # The op library and its kernel libraries go into a shared object.
  # flashlab.testing's operators (flashlab_testing_ops.cpp) are the harness's
  # entries, so the harness (and the developer kernels it runs: planted bugs)
  # goes into the shared object too.
  set_target_properties(flashlab flashlab_harness PROPERTIES POSITION_INDEPENDENT_CODE ON)
  add_library(flashlab_ops SHARED src/python/flashlab_ops.cpp src/python/flashlab_testing_ops.cpp)
  target_link_libraries(flashlab_ops PRIVATE flashlab flashlab_harness)
  set_target_properties(flashlab_ops PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/python"
    # torch's libraries are loaded by `import torch` before this one; cudart is
    # found where the build found it.
    INSTALL_RPATH "${CUDAToolkit_LIBRARY_DIR}")
  install(TARGETS flashlab_ops LIBRARY DESTINATION flashlab COMPONENT python)

  # The C++ runtime: the shared libstdc++ the Python process already holds for
  # torch. A compiler that has only a static libstdc++ (the GPU machine's
  # /opt/gcc g++ 13.3: -print-file-name finds no libstdc++.so) links a private
  # copy into the extension, beside the process's shared one; the two copies'
  # locale state disagree, and the first c10::Error whose message streams a
  # number crashed in std::ostream::_M_insert<long> (session 20). Linking the
  # system's libstdc++.so.6 first keeps one copy.
  execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -print-file-name=libstdc++.so
                  OUTPUT_VARIABLE _shared_libstdcxx OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT IS_ABSOLUTE "${_shared_libstdcxx}")
    find_library(FLASHLAB_SHARED_LIBSTDCXX NAMES libstdc++.so.6
                 PATHS /usr/lib/x86_64-linux-gnu /usr/lib64 /lib/x86_64-linux-gnu /usr/lib NO_DEFAULT_PATH)
    if(FLASHLAB_SHARED_LIBSTDCXX)
      target_link_libraries(flashlab_ops PRIVATE "${FLASHLAB_SHARED_LIBSTDCXX}")
      message(STATUS "flashlab: ${CMAKE_CXX_COMPILER} has no shared libstdc++; the extension links ${FLASHLAB_SHARED_LIBSTDCXX}")
    else()
      message(WARNING "flashlab: ${CMAKE_CXX_COMPILER} has no shared libstdc++ and none was found in the system's "
                      "library folders: the extension gets a private static copy (c10::Error messages may crash)")
    endif()
  endif()

  if(FLASHLAB_BUILD_TESTS)
    # pytest over tests/python against the build tree: the package from the
    # source tree, the extension from FLASHLAB_OPS_LIBRARY. A run whose every
    # case skipped (the gpu marker without a GPU, or no pytest) reports skipped.
    set(pytest_environment
        "PYTHONPATH=${PROJECT_SOURCE_DIR}/src/python"
        "FLASHLAB_OPS_LIBRARY=$<TARGET_FILE:flashlab_ops>"
        "FLASHLAB_RUN=$<TARGET_FILE:flashlab-run>"
        "PYTHONDONTWRITEBYTECODE=1")
    set(pytest_all_skipped "=+ [0-9]+ skipped(, [0-9]+ (deselected|warnings?))* in [0-9.]+s|flashlab: pytest is not installed")
    # python_cpu: everything not marked gpu (import, schemas, fake shapes, argument
    # errors); python_gpu: the GPU suite's default subset (FLASHLAB_FULL_MATRIX=1: all).
    foreach(label cpu gpu)
      if(label STREQUAL "cpu")
        set(marker "not gpu")
      else()
        set(marker "gpu")
      endif()
      add_test(NAME python_${label}
               COMMAND "${FLASHLAB_PYTHON}" "${PROJECT_SOURCE_DIR}/tests/python/run_pytest.py"
                       "${PROJECT_SOURCE_DIR}/tests/python" -m "${marker}")
      set_tests_properties(python_${label} PROPERTIES
        LABELS ${label} TIMEOUT 600 ENVIRONMENT "${pytest_environment}"
        SKIP_REGULAR_EXPRESSION "${pytest_all_skipped}")
    endforeach()
    # The FP8 forward under compute-sanitizer, through the Python API (flashlab-run
    # has no e4m3): skipped without a compute capability 9.0 GPU.
    foreach(tool memcheck racecheck synccheck)
      add_test(NAME sanitizer_fp8_${tool}
               COMMAND "${PROJECT_SOURCE_DIR}/tests/sanitizer/run_fp8_sanitizer.sh" ${tool} "${FLASHLAB_PYTHON}")
      set_tests_properties(sanitizer_fp8_${tool} PROPERTIES
        LABELS sanitizer SKIP_RETURN_CODE 77 TIMEOUT 600 RUN_SERIAL TRUE ENVIRONMENT "${pytest_environment}")
    endforeach()
    # The Triton example (examples/triton) against its own reference and through
    # flashlab.testing; without a GPU in Triton's CPU interpreter, skipped without
    # triton (or numpy, which the interpreter needs).
    add_test(NAME triton_example
             COMMAND "${FLASHLAB_PYTHON}" "${PROJECT_SOURCE_DIR}/tests/python/run_pytest.py"
                     "${PROJECT_SOURCE_DIR}/examples/triton" -p no:cacheprovider -rs)
    set_tests_properties(triton_example PROPERTIES
      LABELS cpu TIMEOUT 900 ENVIRONMENT "${pytest_environment}"
      SKIP_REGULAR_EXPRESSION "${pytest_all_skipped}")
  endif()
endif()
