# Detects a usable nvcc and defines triax_add_cuda(target), which adds kernels/*.cu and links
# cudart, cuBLAS, cuBLASLt and NCCL (and cuDNN with its frontend where TriaxCudnn.cmake finds
# them). Sets TRIAX_HAVE_CUDA and TRIAX_HAVE_CUDNN_FRONTEND.
set(TRIAX_HAVE_CUDA OFF)
set(TRIAX_HAVE_CUDNN_FRONTEND OFF)
if(NOT TRIAX_WITH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # CMake 3.25 does not know nvcc 13's C++20 flag.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${TRIAX_CUDA_ARCHITECTURES})
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    include(${CMAKE_CURRENT_LIST_DIR}/TriaxCudaDeps.cmake)
    if(TRIAX_NCCL_LIBRARY AND TRIAX_NCCL_INCLUDE_DIR)
      set(TRIAX_HAVE_CUDA ON)
      message(STATUS "triax: NCCL ${TRIAX_NCCL_VERSION}: ${TRIAX_NCCL_LIBRARY} (headers ${TRIAX_NCCL_INCLUDE_DIR})")
      include(${CMAKE_CURRENT_LIST_DIR}/TriaxCudnn.cmake)
    elseif(TRIAX_WITH_CUDA STREQUAL "ON")
      message(FATAL_ERROR "triax: TRIAX_WITH_CUDA=ON but NCCL was not found: set NCCL_ROOT to the directory "
        "holding include/nccl.h and lib/libnccl.so[.2] (for PyTorch's wheel: python3 -c "
        "'import nvidia.nccl as m; print(list(m.__path__)[0])')")
    else()
      message(WARNING "triax: nvcc found but NCCL not found (set NCCL_ROOT); building without CUDA")
    endif()
  elseif(TRIAX_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "triax: TRIAX_WITH_CUDA=ON but no CUDA compiler was found")
  endif()
endif()

# Warnings: nvcc's own (front end, ptxas, nvlink) and the host compiler's on kernels/*.cu, errors
# unless TRIAX_CUDA_WERROR=OFF. Not -Wmissing-launch-bounds: nvcc 13.0 reports it at every launch
# of a kernel template, __launch_bounds__ or not.
# ptxas -warn-spills makes a register spill a warning, so an error, in every file but those of
# TRIAX_CUDA_SPILLS_REVIEWED: the CUDA-core attention kernels (attention.cu, and attention_block.cu
# for the context-parallel blocks) keep a head's vectors (HS floats,
# three or four of them) in registers per thread and spill at head sizes 64 and 128 (docs/CUDA.md; the
# fused cuDNN path replaces them); their spill bytes are capped by tests/cuda/kernel_budget.txt.
option(TRIAX_CUDA_WERROR "CUDA: nvcc, ptxas and host-compiler warnings on kernels/*.cu are errors" ON)
# The host compiler's set is the C++ sources' (CMakeLists.txt): -Wall -Wextra without unused-parameter.
set(TRIAX_CUDA_WARNINGS -Wreorder -Wdefault-stream-launch -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter)
set(TRIAX_CUDA_SPILLS_REVIEWED attention.cu attention_block.cu)
if(TRIAX_CUDA_WERROR)
  list(APPEND TRIAX_CUDA_WARNINGS --Werror=all-warnings -Xcompiler=-Werror)
endif()
# The per-kernel resource record: every kernels/*.cu compile runs through
# scripts/kernel_budget.py record, which keeps ptxas's per-kernel report (-v: registers, stack
# frame, spill stores/loads, per SM architecture) in ${TRIAX_KERNEL_RECORD_DIR}/<object>.txt and
# passes every other line of the compiler's output through; the test cuda.kernel_budget compares
# the records with tests/cuda/kernel_budget.txt.
# Without a Python 3 interpreter nothing is recorded and the test is not registered.
set(TRIAX_KERNEL_RECORD_DIR ${PROJECT_BINARY_DIR}/kernel_resources)
set(TRIAX_KERNEL_RECORDS OFF)
if(TRIAX_HAVE_CUDA)
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    set(TRIAX_KERNEL_RECORDS ON)
  else()
    message(WARNING "triax: no Python 3 interpreter: no per-kernel resource records, no test cuda.kernel_budget")
  endif()
endif()

function(triax_add_cuda target)
  file(GLOB _cu CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/*.cu)
  target_sources(${target} PRIVATE ${_cu})
  foreach(_f ${_cu})
    get_filename_component(_name ${_f} NAME)
    if(NOT _name IN_LIST TRIAX_CUDA_SPILLS_REVIEWED)
      set_property(SOURCE ${_f} APPEND PROPERTY COMPILE_OPTIONS -Xptxas=-warn-spills)
    endif()
  endforeach()
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${TRIAX_CUDA_ARCHITECTURES}")
  target_compile_definitions(${target} PUBLIC TRIAX_HAVE_CUDA=1)
  # fmt 9's consteval format strings do not compile under nvcc in C++20.
  set(_report)
  if(TRIAX_KERNEL_RECORDS)
    set(_report -Xptxas=-v)  # ptxas's per-kernel report, which the launcher below keeps
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-DFMT_USE_CONSTEXPR=1 --expt-relaxed-constexpr
    ${TRIAX_CUDA_WARNINGS} ${_report}>)
  if(TRIAX_KERNEL_RECORDS)
    set(_launcher ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/kernel_budget.py record ${TRIAX_KERNEL_RECORD_DIR} --)
    if(CMAKE_CUDA_COMPILER_LAUNCHER)
      list(APPEND _launcher ${CMAKE_CUDA_COMPILER_LAUNCHER})  # ccache after the recorder: a hit replays ptxas's report
    endif()
    set_target_properties(${target} PROPERTIES CUDA_COMPILER_LAUNCHER "${_launcher}")
  endif()
  target_link_libraries(${target} PUBLIC CUDA::cudart CUDA::cublas CUDA::cublasLt triax_nccl)
  if(TRIAX_HAVE_CUDNN_FRONTEND)
    triax_add_cudnn(${target})
  endif()
endfunction()
