# cmake -DIN=<file.proto> -DOUT=<file.proto> -P StripGoProtoOptions.cmake
#
# Copies a Go project's .proto (etcd's, from Debian golang-etcd-server-dev)
# without the options only Go and the HTTP gateway use: the imports of
# gogoproto/gogo.proto and google/api/annotations.proto, every
# `option (gogoproto.x) = ...;`, every `[(gogoproto.x) = ...]` field option and
# every `option (google.api.http) = {...};` block. The wire format (messages,
# fields, services) is untouched, so the C++ generated from the copy talks to
# the real server.
if(NOT IN OR NOT OUT)
  message(FATAL_ERROR "StripGoProtoOptions: IN and OUT are required")
endif()
file(READ "${IN}" text)
string(REGEX REPLACE "import \"gogoproto/gogo.proto\";" "" text "${text}")
string(REGEX REPLACE "import \"google/api/annotations.proto\";" "" text "${text}")
string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) = [a-z]+;" "" text "${text}")
string(REGEX REPLACE " *\\[\\(gogoproto\\.[^]]*\\]" "" text "${text}")
string(REGEX REPLACE "additional_bindings {[^}]*}" "" text "${text}")  # nested in the next
string(REGEX REPLACE "option \\(google\\.api\\.http\\) = {[^}]*};" "" text "${text}")
if(text MATCHES "gogoproto|google\\.api")
  message(FATAL_ERROR "StripGoProtoOptions: ${IN} still names gogoproto or google.api after stripping")
endif()
file(WRITE "${OUT}" "${text}")
