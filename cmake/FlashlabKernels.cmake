# How a kernel library is built.
#
# flashlab_cuda_options(target): the device flags of every CUDA target:
#   release -O3 -lineinfo (CMAKE_CUDA_FLAGS_RELEASE adds -DNDEBUG), debug -G -g,
#   --expt-relaxed-constexpr, and ptxas warnings on register spills.
#
# flashlab_kernel_library(name dir ARCHITECTURES archs [JOB_POOL pool]):
#   a STATIC library of every dir/*/*.cu and dir/*/*.cpp (one folder per kernel),
#   plus the instantiations generated from dir/*/*.cu.in templates (see
#   flashlab_generate_instantiations). While the family has no source yet it is
#   an INTERFACE library, so linking it costs nothing.
#
# flashlab_generate_instantiations(out_var dir): for each <dir>/<folder>/<stem>.cu.in,
#   one <stem><value>.cu per value of the folder's list, generated into the build
#   tree with @HEAD_DIM@ replaced. A folder may hold several templates (the
#   forward's <kernel>_hdim.cu.in, the backward's <kernel>_bwd_hdim.cu.in); all
#   of them follow the folder's one list. The list is the one the kernel's C++ uses: the
#   line of <folder>/<kernel>.h that reads
#     using HeadDims = HeadDimList<32, 64, ...>;
#   so adding a head dim is one edit of that line (CMake re-runs when it changes).

function(flashlab_cuda_options target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr --ptxas-options=-warn-spills>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<CONFIG:Release>>:-O3 -lineinfo>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<CONFIG:Debug>>:-G -g>)
endfunction()

function(flashlab_generate_instantiations out_var dir)
  file(GLOB templates CONFIGURE_DEPENDS "${dir}/*/*.cu.in")
  set(generated)
  foreach(template IN LISTS templates)
    get_filename_component(folder "${template}" DIRECTORY)
    get_filename_component(kernel "${folder}" NAME)
    set(list_header "${folder}/${kernel}.h")
    if(NOT EXISTS "${list_header}")
      message(FATAL_ERROR "${template}: expected the head-dim list in ${list_header}")
    endif()
    set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${list_header}")
    file(STRINGS "${list_header}" list_line REGEX "^[ \t]*using HeadDims = HeadDimList<[0-9, ]+>;")
    list(LENGTH list_line count)
    if(NOT count EQUAL 1)
      message(FATAL_ERROR "${list_header}: expected one line 'using HeadDims = HeadDimList<...>;'")
    endif()
    string(REGEX REPLACE ".*HeadDimList<([0-9, ]+)>.*" "\\1" values "${list_line}")
    string(REPLACE " " "" values "${values}")
    string(REPLACE "," ";" values "${values}")
    get_filename_component(stem "${template}" NAME)
    string(REGEX REPLACE "\\.cu\\.in$" "" stem "${stem}")
    file(RELATIVE_PATH relative "${PROJECT_SOURCE_DIR}" "${folder}")
    foreach(HEAD_DIM IN LISTS values)
      set(output "${PROJECT_BINARY_DIR}/generated/${relative}/${stem}${HEAD_DIM}.cu")
      configure_file("${template}" "${output}" @ONLY)
      list(APPEND generated "${output}")
    endforeach()
  endforeach()
  set(${out_var} ${generated} PARENT_SCOPE)
endfunction()

function(flashlab_kernel_library name dir)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "JOB_POOL" "ARCHITECTURES")
  file(GLOB sources CONFIGURE_DEPENDS "${dir}/*/*.cu" "${dir}/*/*.cpp")
  flashlab_generate_instantiations(generated "${dir}")
  list(APPEND sources ${generated})
  if(NOT sources)
    add_library(${name} INTERFACE)
    return()
  endif()
  add_library(${name} STATIC ${sources})
  target_link_libraries(${name} PRIVATE flashlab_kernel_common)
  set_target_properties(${name} PROPERTIES
    CUDA_ARCHITECTURES "${arg_ARCHITECTURES}"
    POSITION_INDEPENDENT_CODE ON)
  if(arg_JOB_POOL)
    set_target_properties(${name} PROPERTIES JOB_POOL_COMPILE ${arg_JOB_POOL})
  endif()
  flashlab_cuda_options(${name})
endfunction()
