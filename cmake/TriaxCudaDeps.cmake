# NCCL has no CMake target: find it (NCCL_ROOT, the toolkit's, or the nvidia-nccl wheel of the
# active Python, as on the PyTorch images) and wrap it as the imported target triax_nccl. Shared
# by the build and the installed config (which passes the directories found at build time in
# TRIAX_NCCL_BUILD_HINTS).
#
# Search order, first directory that has it wins, header and library from the same place:
#   NCCL_ROOT (CMake variable, then environment), the build-time directories (installed config),
#   the CUDA toolkit, the Python wheel, then the system paths.
if(NOT NCCL_ROOT AND NOT DEFINED ENV{NCCL_ROOT} AND NOT TRIAX_NCCL_LIBRARY)
  # pip's nvidia-nccl-cu12/cu13 ships include/nccl.h and lib/libnccl.so.2 (no unversioned link)
  # under site-packages/nvidia/nccl. __path__ works for namespace and regular packages alike.
  find_program(TRIAX_PYTHON3 NAMES python3 python)
  if(TRIAX_PYTHON3)
    execute_process(
      COMMAND ${TRIAX_PYTHON3} -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
      OUTPUT_VARIABLE _triax_py_nccl OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _triax_py_rc)
    if(_triax_py_rc EQUAL 0 AND IS_DIRECTORY "${_triax_py_nccl}")
      set(TRIAX_NCCL_PYTHON_ROOT "${_triax_py_nccl}" CACHE PATH "NCCL of the Python nvidia-nccl wheel")
    endif()
  endif()
endif()

set(_triax_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${TRIAX_NCCL_BUILD_HINTS})
foreach(_d ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_INCLUDE_DIRS})
  get_filename_component(_p "${_d}" DIRECTORY)  # <toolkit>/lib64 or /include -> <toolkit>
  list(APPEND _triax_nccl_hints "${_p}")
endforeach()
list(APPEND _triax_nccl_hints ${TRIAX_NCCL_PYTHON_ROOT})

find_path(TRIAX_NCCL_INCLUDE_DIR nccl.h HINTS ${_triax_nccl_hints} PATH_SUFFIXES include)
# NAMES_PER_DIR: otherwise CMake looks for "nccl" in every directory before "libnccl.so.2" in
# any, and a wheel's libnccl.so.2 would lose to some other libnccl.so (header/library mismatch).
find_library(TRIAX_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
  HINTS ${_triax_nccl_hints} PATH_SUFFIXES lib lib64)

if(TRIAX_NCCL_LIBRARY AND TRIAX_NCCL_INCLUDE_DIR)
  file(STRINGS "${TRIAX_NCCL_INCLUDE_DIR}/nccl.h" _triax_nccl_ver REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*" "\\1.\\2.\\3"
         TRIAX_NCCL_VERSION "${_triax_nccl_ver}")
  if(NOT TARGET triax_nccl)
    add_library(triax_nccl INTERFACE IMPORTED)
    set_target_properties(triax_nccl PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${TRIAX_NCCL_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${TRIAX_NCCL_LIBRARY}")
  endif()
endif()
