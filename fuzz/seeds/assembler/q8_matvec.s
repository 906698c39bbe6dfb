kernel "q8_matvec": 3 args, 15 insns, local 17440 B, constants 0 B
  arg0 w: in buffer q8_0
  arg1 x: in buffer f32
  arg2 y: out buffer f32
  0000: li r0, 0
  0001: li r1, 272
  0002: li r2, 4
  0003: tdef t0, f32, 8 x 256, local 0
  0004: tdef t1, f32, 1 x 256, local 8192
  0005: tdef t2, f32, 8 x 256, local 9216
  0006: tdef t3, f32, 8 x 1, local 17408
  0007: loop r2 -> 0013
  0008:   tldq t0, arg0[r0], stride_bytes r1, q8_0
  0009:   tld t1, arg1[r0], f32
  0010:   tbin.mul t2, t0, t1, bcast_row
  0011:   tred.sum t3, t2
  0012:   tst t3, arg2[r0], f32
  0013: endloop -> 0007
  0014: exit
