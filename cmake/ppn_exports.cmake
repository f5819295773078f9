# ppn_exports.cmake - libppn.so's export list, generated from include/ppn.h at build time.
#
#   cmake -DHEADER=include/ppn.h -DMAP=ppn.map -DLIST=ppn.exports -P cmake/ppn_exports.cmake
#
# Every function ppn.h declares is exported and nothing else: the internal functions are named ppn_* too, so a
# ppn_* wildcard would export them all. MAP is a linker version script (global: the names; local: *), LIST the
# same names one a line (tests/test_install.sh compares them with `nm -D`). A declaration is a type word, then
# ppn_<name>, then "(", once comments and preprocessor lines are gone; a function-pointer member or typedef
# ("(*ppn_cb)(") has ")" after its name and is not one.
if(NOT HEADER OR NOT MAP OR NOT LIST)
  message(FATAL_ERROR "usage: cmake -DHEADER=ppn.h -DMAP=out.map -DLIST=out.txt -P ppn_exports.cmake")
endif()
file(READ "${HEADER}" text)
string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" " " text "${text}")           # block comments
string(REGEX REPLACE "//[^\n]*" " " text "${text}")                                # line comments
string(REGEX REPLACE "\n[ \t]*#([^\n]*\\\\\n)*[^\n]*" "\n" text "\n${text}")       # preprocessor lines
string(REGEX MATCHALL "[A-Za-z0-9_]+[ \t\n*]+ppn_[A-Za-z0-9_]+[ \t\n]*\\(" decls "${text}")
set(names "")
foreach(d IN LISTS decls)
  string(REGEX MATCH "ppn_[A-Za-z0-9_]+[ \t\n]*\\($" name "${d}")
  string(REGEX REPLACE "[ \t\n]*\\($" "" name "${name}")
  list(APPEND names ${name})
endforeach()
list(REMOVE_DUPLICATES names)
list(SORT names)
list(LENGTH names n)
if(n EQUAL 0)
  message(FATAL_ERROR "ppn_exports.cmake: no function declarations found in ${HEADER}")
endif()

set(map "/* generated from ${HEADER} by cmake/ppn_exports.cmake: do not edit */\n{\n  global:\n")
set(list_text "")
foreach(name IN LISTS names)
  string(APPEND map "    ${name};\n")
  string(APPEND list_text "${name}\n")
endforeach()
string(APPEND map "  local:\n    *;\n};\n")
# Rewrite only what changed, so an edit to a comment in ppn.h relinks nothing.
file(CONFIGURE OUTPUT "${MAP}" CONTENT "${map}" @ONLY)
file(CONFIGURE OUTPUT "${LIST}" CONTENT "${list_text}" @ONLY)
