# cmake -DIN=<file.proto> -DOUT=<file.proto> -P StripGoProtoOptions.cmake
#
# Writes OUT: the .proto IN without what only Go's generators and the HTTP
# gateway read, so that protoc can compile etcd's protos as Debian ships them
# (golang-etcd-server-dev) without gogoproto and googleapis:
#   - import "gogoproto/gogo.proto" and import "google/api/annotations.proto";
#   - file options (gogoproto.*) and field options [(gogoproto.*) = ...];
#   - method options (google.api.http) = { ... }, with their
#     additional_bindings { ... }.
# Nothing that reaches the wire changes: field numbers, types and services
# stay as they are.
if(NOT DEFINED IN OR NOT DEFINED OUT)
  message(FATAL_ERROR "usage: cmake -DIN=<proto> -DOUT=<proto> -P ${CMAKE_CURRENT_LIST_FILE}")
endif()
file(READ "${IN}" text)
string(REGEX REPLACE "import \"gogoproto/gogo\\.proto\";[ \t]*\n" "" text "${text}")
string(REGEX REPLACE "import \"google/api/annotations\\.proto\";[ \t]*\n" "" text "${text}")
string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) = [a-z]+;[ \t]*\n" "" text "${text}")
string(REGEX REPLACE "[ \t]*\\[\\(gogoproto\\.[^]]*\\]" "" text "${text}")
# One level of nested braces: additional_bindings { ... }.
string(REGEX REPLACE "option \\(google\\.api\\.http\\) = {([^{}]|{[^{}]*})*};" "" text "${text}")
if(text MATCHES "gogoproto|google\\.api")
  message(FATAL_ERROR "${IN}: an option of gogoproto or google.api is left that this script does not strip")
endif()
file(WRITE "${OUT}" "${text}")
