# Warns when the CUDA toolkit that builds the kernels is a newer major version than the CUDA torch
# was built with. The extension links the CUDA runtime statically, and a runtime needs a driver at
# least as new as itself (CUDA 13: driver >= 580; CUDA 12: >= 525): on a machine whose driver
# serves torch's older CUDA, every fedkernels CUDA call would fail while torch works.
#
# Included by CMakeLists.txt; also runs alone (tests/test_backend.py):
#   cmake -DFK_NVCC_VERSION=13.0.88 -DFK_TORCH_CUDA=12.4 -P cmake/check_cuda_versions.cmake

function(fk_check_cuda_versions nvcc_version torch_cuda)
  if(NOT nvcc_version OR NOT torch_cuda)
    return()  # torch not importable at configure time, or a CPU build of torch: nothing to compare
  endif()
  string(REGEX MATCH "^[0-9]+" nvcc_major "${nvcc_version}")
  string(REGEX MATCH "^[0-9]+" torch_major "${torch_cuda}")
  if(nvcc_major AND torch_major AND nvcc_major GREATER torch_major)
    set(driver "")
    if(nvcc_major GREATER_EQUAL 13)
      set(driver " (>= 580)")
    elseif(nvcc_major EQUAL 12)
      set(driver " (>= 525)")
    endif()
    message(WARNING
      "fedkernels: nvcc is CUDA ${nvcc_version} but the installed torch was built with CUDA "
      "${torch_cuda}. The kernels link the CUDA ${nvcc_major} runtime statically, which needs an "
      "NVIDIA driver that supports CUDA ${nvcc_major}${driver}; with an older driver every "
      "fedkernels CUDA call fails while torch keeps working. Check `nvidia-smi` (it shows the "
      "highest CUDA version the driver supports), or build with a CUDA ${torch_major} toolkit: "
      "CUDACXX=/path/to/cuda-${torch_major}/bin/nvcc pip install .")
  endif()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE AND CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  fk_check_cuda_versions("${FK_NVCC_VERSION}" "${FK_TORCH_CUDA}")
endif()
