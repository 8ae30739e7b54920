# cmake -DOUTPUT=<archive> -DAR=<ar> -DINPUTS=<a;b;...> -P merge_archives.cmake
#
# Writes OUTPUT as one static archive holding every member of INPUTS (GNU
# ar's MRI script), so that the installed libmeshrt.a carries libmesh's
# private helper archives with it.
if(NOT OUTPUT OR NOT AR OR NOT INPUTS)
  message(FATAL_ERROR "merge_archives.cmake needs OUTPUT, AR and INPUTS")
endif()
get_filename_component(dir "${OUTPUT}" DIRECTORY)
file(MAKE_DIRECTORY "${dir}")
set(script "CREATE ${OUTPUT}.tmp\n")
foreach(input IN LISTS INPUTS)
  string(APPEND script "ADDLIB ${input}\n")
endforeach()
string(APPEND script "SAVE\nEND\n")
file(WRITE "${OUTPUT}.mri" "${script}")
file(REMOVE "${OUTPUT}.tmp")
execute_process(COMMAND "${AR}" -M INPUT_FILE "${OUTPUT}.mri" RESULT_VARIABLE result
                ERROR_VARIABLE error)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${AR} -M failed (${result}): ${error}")
endif()
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
