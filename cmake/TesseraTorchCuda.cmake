# CUDA for LibTorch's CMake package, included before find_package(Torch) by Tessera's build
# (cmake/TesseraDependencies.cmake) and by its installed package (cmake/TesseraConfig.cmake.in).
#
# The torch wheel is the CUDA 13 build. Its CMake package looks for a CUDA toolkit (nvcc) and stops without one,
# although Tessera compiles no CUDA kernels: it needs CUDA's runtime headers and library and NCCL's header, which the
# nvidia-* wheels that pip installs beside torch ship (site-packages/nvidia/cu13, nvidia/nccl), with the headers those
# include from the nvidia-cuda-crt and nvidia-cuda-cccl wheels (tools/requirements.txt). So an installed CUDA
# toolkit of the wheel's CUDA major version is used as Torch's package finds it, and otherwise (none, or another
# version) CUDA comes from those wheels: defining torch::cudart first makes Torch's package skip its toolkit search
# (its public/cuda.cmake returns when that target exists), so a machine without a toolkit configures and links, and
# the programs load the same libcudart as LibTorch. TESSERA_CUDA_FROM_WHEELS=ON takes the wheels even beside a
# toolkit, OFF never (a LibTorch of one's own beside its toolkit); a CPU-only LibTorch needs neither.
#
#   tessera_torch_cuda(TORCH_DIR)  sets TESSERA_NCCL_HINT (the folder with nccl.h) when the wheels provide CUDA
set(TESSERA_CUDA_FROM_WHEELS "AUTO" CACHE STRING
    "CUDA's runtime from the nvidia-* wheels beside torch: AUTO (when no toolkit of their version is installed), ON, OFF")
macro(tessera_torch_cuda _torch_dir)
  get_filename_component(_tessera_torch_prefix "${_torch_dir}/../../.." ABSOLUTE)  # .../site-packages/torch
  get_filename_component(_tessera_nvidia "${_tessera_torch_prefix}/../nvidia" ABSOLUTE)
  set(_tessera_wheels OFF)
  if(EXISTS "${_tessera_torch_prefix}/lib/libtorch_cuda.so" AND NOT TESSERA_CUDA_FROM_WHEELS STREQUAL "OFF"
     AND NOT TARGET torch::cudart)
    file(GLOB _tessera_cudart "${_tessera_nvidia}/cu*/lib/libcudart.so.[0-9]*")
    set(_tessera_wheel_major "none")
    if(_tessera_cudart)
      list(GET _tessera_cudart 0 _tessera_cudart)
      string(REGEX REPLACE ".*libcudart\\.so\\.([0-9]+).*" "\\1" _tessera_wheel_major "${_tessera_cudart}")
    endif()
    # An installed toolkit's major version, from its cuda_runtime_api.h, found where Torch's package looks.
    set(_tessera_toolkit_major "")
    find_program(TESSERA_NVCC nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH PATH_SUFFIXES bin PATHS /usr/local/cuda/bin)
    if(TESSERA_NVCC)
      get_filename_component(_tessera_root "${TESSERA_NVCC}/../.." ABSOLUTE)
      foreach(_tessera_h "${_tessera_root}/include" "${_tessera_root}/targets/x86_64-linux/include")
        if(NOT _tessera_toolkit_major AND EXISTS "${_tessera_h}/cuda_runtime_api.h")
          file(STRINGS "${_tessera_h}/cuda_runtime_api.h" _tessera_v REGEX "^#define CUDART_VERSION +[0-9]+")
          string(REGEX REPLACE "[^0-9]*([0-9]+)[0-9][0-9][0-9]$" "\\1" _tessera_toolkit_major "${_tessera_v}")
        endif()
      endforeach()
    endif()
    if(NOT _tessera_cudart AND (TESSERA_CUDA_FROM_WHEELS STREQUAL "ON" OR NOT _tessera_toolkit_major))
      message(FATAL_ERROR "LibTorch in ${_tessera_torch_prefix} is a CUDA build and needs CUDA's runtime, but the "
                          "nvidia-cuda-runtime wheel that pip installs with it is not in ${_tessera_nvidia} and no "
                          "CUDA toolkit (nvcc) is installed: run tools/setup.sh again.")
    endif()
    if(_tessera_cudart AND (TESSERA_CUDA_FROM_WHEELS STREQUAL "ON"
                            OR NOT _tessera_toolkit_major STREQUAL _tessera_wheel_major))
      set(_tessera_wheels ON)
    endif()
  endif()
  if(_tessera_wheels)
    get_filename_component(_tessera_cuda_wheel "${_tessera_cudart}/../.." ABSOLUTE)
    add_library(torch::cudart SHARED IMPORTED)
    set_target_properties(torch::cudart PROPERTIES IMPORTED_LOCATION "${_tessera_cudart}"
                                                   INTERFACE_INCLUDE_DIRECTORIES "${_tessera_cuda_wheel}/include")
    set(TESSERA_NCCL_HINT "${_tessera_nvidia}/nccl/include")
    message(STATUS "CUDA ${_tessera_wheel_major} runtime from the nvidia wheel beside torch: ${_tessera_cudart}")
  elseif(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    # Torch's own toolkit search: with no GPU to probe it would fall back to a long architecture list with a warning;
    # name the architectures we target (Hopper, plus Ampere) instead.
    set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
  endif()
endmacro()
