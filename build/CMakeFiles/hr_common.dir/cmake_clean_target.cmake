file(REMOVE_RECURSE
  "libhr_common.a"
)
