# `dsv4 generate ARGS` with and without PAR_ARGS (simulated ranks) must print the same ids.
separate_arguments(args UNIX_COMMAND "${ARGS}")
separate_arguments(par UNIX_COMMAND "${PAR_ARGS}")
execute_process(COMMAND ${DSV4} generate ${args} OUTPUT_VARIABLE single RESULT_VARIABLE rc1)
execute_process(COMMAND ${DSV4} generate ${args} ${par} OUTPUT_VARIABLE multi RESULT_VARIABLE rc2)
if(NOT rc1 EQUAL 0 OR NOT rc2 EQUAL 0 OR NOT single STREQUAL multi OR single STREQUAL "")
  message(FATAL_ERROR "single rank: '${single}' (rc ${rc1}); ${PAR_ARGS}: '${multi}' (rc ${rc2})")
endif()
message(STATUS "same tokens: ${single}")
