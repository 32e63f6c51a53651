# Finds NCCL: NCCL_ROOT / $NCCL_HOME, the CUDA toolkit, or the pip wheel nvidia-nccl-cu13
# (site-packages/nvidia/nccl, where the GPU machine has it). Defines NCCL::nccl.
find_package(Python3 COMPONENTS Interpreter QUIET)
set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR} /usr/local/cuda)
if(Python3_Interpreter_FOUND)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))"
                  OUTPUT_VARIABLE _nccl_py OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_nccl_py)
    list(APPEND _nccl_hints ${_nccl_py})
  endif()
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY} INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
endif()
