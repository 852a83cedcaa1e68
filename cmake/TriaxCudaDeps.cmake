# NCCL has no CMake target: find it (the toolkit's, NCCL_ROOT, or a pip nvidia-nccl package)
# and wrap it as the imported target triax_nccl. Shared by the build and the installed config.
find_path(TRIAX_NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(TRIAX_NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
if(TRIAX_NCCL_LIBRARY AND TRIAX_NCCL_INCLUDE_DIR AND NOT TARGET triax_nccl)
  add_library(triax_nccl INTERFACE IMPORTED)
  set_target_properties(triax_nccl PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${TRIAX_NCCL_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${TRIAX_NCCL_LIBRARY}")
endif()
