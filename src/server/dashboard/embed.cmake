# embed.cmake: writes the dashboard page as a C array (cmake -DIN=page.html -DOUT=page.c -P embed.cmake).
# Run at build time by the hr_server target, so an edited page is rebuilt into the binary.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n "${n_hex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," body "${hex}")
file(WRITE "${OUT}.tmp"
  "/* generated from ${IN} by embed.cmake: do not edit */\n"
  "#include \"server/dashboard.h\"\n"
  "const char hr_srv_dashboard_html[] = {${body}'\\0'};\n"
  "const size_t hr_srv_dashboard_html_len = ${n};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
