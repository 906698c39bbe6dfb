kernel "gemv q4_K 16x256": 3 args, 24 insns, local 1056 B, constants 0 B
  arg0 w: in buffer q4_K
  arg1 x: in buffer f32
  arg2 y: out buffer f32
  0000: special r0, block_id
  0001: alui.mul r1, r0, 1
  0002: li r2, 2
  0003: alu.sub r2, r2, r1
  0004: alui.min r2, r2, 1
  0005: alui.max r2, r2, 0
  0006: alui.mul r3, r1, -8
  0007: alui.add r3, r3, 16
  0008: alui.mul r5, r1, 1152
  0009: alui.mul r6, r1, 32
  0010: li r9, 144
  0011: li r11, 0
  0012: tdef t1, f32, 1 x 256, local 0
  0013: tld t1, arg1[r11], f32
  0014: loop r2 -> 0022
  0015:   alui.min r4, r3, 8
  0016:   tdef t2, f32, r4 x 1, local 1024
  0017:   tmv t2, arg0[r5], stride_bytes r9, t1, q4_K
  0018:   tst t2, arg2[r6], f32
  0019:   alui.add r5, r5, 1152
  0020:   alui.add r6, r6, 32
  0021:   alui.sub r3, r3, 8
  0022: endloop -> 0014
  0023: exit
