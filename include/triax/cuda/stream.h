// cudaStream_t for the host-only headers of include/triax/cuda: the same forward declaration the
// CUDA runtime makes (driver_types.h), so a .cpp can name a stream without including CUDA headers.
// Repeating an identical typedef is legal C++, in either include order.
#pragma once

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;  // NOLINT(modernize-use-using): must match driver_types.h
