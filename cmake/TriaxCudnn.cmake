# cuDNN fused attention (src/cuda/cudnn_attention.cpp) needs two things, both optional:
#   - the cuDNN frontend's header-only C++ API, cudnn_frontend.h: TRIAX_CUDNN_FRONTEND_INCLUDE_DIR,
#     by default <source>/.deps/cudnn-frontend/include (scripts/fetch_cudnn_frontend.sh puts it there);
#   - cuDNN 9 itself, cudnn.h and libcudnn, header and library from the same place: CUDNN_ROOT
#     (CMake variable, then environment), the CUDA toolkit, the nvidia-cudnn wheel of the active
#     Python (PyTorch's images), then the system paths;
#   - NVRTC (CUDA::nvrtc of the toolkit): the frontend's headers reference it (an engine it
#     compiles at run time for other operations), so the link needs it.
# With both (and CUDA on), sets the CMake variable TRIAX_HAVE_CUDNN_FRONTEND=ON and TRIAX_CUDNN_{INCLUDE_DIR,LIBRARY,
# VERSION}; otherwise OFF and the attention runs on the CUDA-core kernels. Included by TriaxCuda.cmake.
set(TRIAX_CUDNN_FRONTEND_INCLUDE_DIR "${PROJECT_SOURCE_DIR}/.deps/cudnn-frontend/include" CACHE PATH
  "Directory holding cudnn_frontend.h (the nvidia-cudnn-frontend wheel's include/; scripts/fetch_cudnn_frontend.sh)")
set(TRIAX_HAVE_CUDNN_FRONTEND OFF)

if(NOT CUDNN_ROOT AND NOT DEFINED ENV{CUDNN_ROOT} AND NOT TRIAX_CUDNN_LIBRARY)
  # pip's nvidia-cudnn-cu12/cu13 ships include/cudnn*.h and lib/libcudnn.so.9 (no unversioned
  # link) under site-packages/nvidia/cudnn.
  find_program(TRIAX_PYTHON3 NAMES python3 python)
  if(TRIAX_PYTHON3)
    execute_process(
      COMMAND ${TRIAX_PYTHON3} -c "import nvidia.cudnn as m; print(list(m.__path__)[0])"
      OUTPUT_VARIABLE _triax_py_cudnn OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _triax_py_rc)
    if(_triax_py_rc EQUAL 0 AND IS_DIRECTORY "${_triax_py_cudnn}")
      set(TRIAX_CUDNN_PYTHON_ROOT "${_triax_py_cudnn}" CACHE PATH "cuDNN of the Python nvidia-cudnn wheel")
    endif()
  endif()
endif()

set(_triax_cudnn_hints ${CUDNN_ROOT} $ENV{CUDNN_ROOT})
foreach(_d ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_INCLUDE_DIRS})
  get_filename_component(_p "${_d}" DIRECTORY)
  list(APPEND _triax_cudnn_hints "${_p}")
endforeach()
list(APPEND _triax_cudnn_hints ${TRIAX_CUDNN_PYTHON_ROOT})
find_path(TRIAX_CUDNN_INCLUDE_DIR cudnn_version.h HINTS ${_triax_cudnn_hints} PATH_SUFFIXES include)
find_library(TRIAX_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 NAMES_PER_DIR
  HINTS ${_triax_cudnn_hints} PATH_SUFFIXES lib lib64)

set(TRIAX_CUDNN_VERSION "")
if(TRIAX_CUDNN_INCLUDE_DIR)
  file(STRINGS "${TRIAX_CUDNN_INCLUDE_DIR}/cudnn_version.h" _triax_cudnn_ver REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
  string(REGEX REPLACE ".*CUDNN_MAJOR ([0-9]+).*CUDNN_MINOR ([0-9]+).*CUDNN_PATCHLEVEL ([0-9]+).*" "\\1.\\2.\\3"
         TRIAX_CUDNN_VERSION "${_triax_cudnn_ver}")
endif()

if(NOT EXISTS "${TRIAX_CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend.h")
  message(STATUS "triax: cuDNN attention off: no cudnn_frontend.h in TRIAX_CUDNN_FRONTEND_INCLUDE_DIR="
    "${TRIAX_CUDNN_FRONTEND_INCLUDE_DIR} (run scripts/fetch_cudnn_frontend.sh)")
elseif(NOT TRIAX_CUDNN_LIBRARY OR NOT TRIAX_CUDNN_INCLUDE_DIR)
  message(STATUS "triax: cuDNN attention off: cuDNN not found (set CUDNN_ROOT to the directory holding "
    "include/cudnn.h and lib/libcudnn.so[.9])")
elseif(NOT TARGET CUDA::nvrtc)
  # The frontend's headers call NVRTC (for engines it compiles at run time; not the attention's).
  message(STATUS "triax: cuDNN attention off: the CUDA toolkit has no NVRTC (CUDA::nvrtc), which the frontend links")
elseif(NOT TRIAX_CUDNN_VERSION MATCHES "^9\\.")
  message(STATUS "triax: cuDNN attention off: cuDNN ${TRIAX_CUDNN_VERSION} at ${TRIAX_CUDNN_INCLUDE_DIR}; 9.x needed")
else()
  file(STRINGS "${TRIAX_CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h" _triax_fe_ver
    REGEX "^#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION ")
  string(REGEX REPLACE ".*MAJOR_VERSION ([0-9]+).*MINOR_VERSION ([0-9]+).*PATCH_VERSION ([0-9]+).*" "\\1.\\2.\\3"
         TRIAX_CUDNN_FRONTEND_VERSION "${_triax_fe_ver}")
  set(TRIAX_HAVE_CUDNN_FRONTEND ON)
  message(STATUS "triax: cuDNN attention on: frontend ${TRIAX_CUDNN_FRONTEND_VERSION} (${TRIAX_CUDNN_FRONTEND_INCLUDE_DIR}), "
    "cuDNN ${TRIAX_CUDNN_VERSION}: ${TRIAX_CUDNN_LIBRARY}")
endif()

# Adds the cuDNN attention to `target` (called by triax_add_cuda when TRIAX_HAVE_CUDNN_FRONTEND).
# Everything is scoped to the two source files that need it, so every other file compiles with the
# same command line with or without the frontend (ccache hits across both builds):
#   - src/cuda/cudnn_attention.cpp gets the frontend's and cuDNN's headers as system headers (not
#     held to triax's warnings) and CUDNN_FRONTEND_SKIP_JSON_LIB (no graph serialisation: the
#     frontend's bundled nlohmann/json stays out, so it cannot clash with the one triax links);
#   - src/cuda/cudnn_attention_select.cpp gets TRIAX_HAVE_CUDNN_FRONTEND=1 (instead of its stubs).
# At run time cuda::cudnn_attention_built() says which.
function(triax_add_cudnn target)
  set_source_files_properties(${PROJECT_SOURCE_DIR}/src/cuda/cudnn_attention.cpp PROPERTIES
    COMPILE_OPTIONS "-isystem;${TRIAX_CUDNN_FRONTEND_INCLUDE_DIR};-isystem;${TRIAX_CUDNN_INCLUDE_DIR}"
    COMPILE_DEFINITIONS "CUDNN_FRONTEND_SKIP_JSON_LIB=1")
  set_source_files_properties(${PROJECT_SOURCE_DIR}/src/cuda/cudnn_attention_select.cpp PROPERTIES
    COMPILE_DEFINITIONS "TRIAX_HAVE_CUDNN_FRONTEND=1")
  target_link_libraries(${target} PRIVATE ${TRIAX_CUDNN_LIBRARY} CUDA::nvrtc)
endfunction()
