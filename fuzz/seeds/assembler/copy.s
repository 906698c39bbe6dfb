kernel "copy": 3 args, 10 insns, local 2048 B, constants 0 B
  arg0 x: in buffer bf16
  arg1 y: out buffer bf16
  arg2 n: in scalar i32
  0000: special r0, block_id
  0001: alui.mul r1, r0, 2048
  0002: li r2, 64
  0003: special r3, arg_value arg2
  0004: tdef t0, bf16, 16 x 64, local 0
  0005: loop r3 -> 0008
  0006:   tld t0, arg0[r1], stride r2, bf16
  0007:   tst t0, arg1[r1], stride r2, bf16
  0008: endloop -> 0005
  0009: exit
