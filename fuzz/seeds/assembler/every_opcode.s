kernel "every_opcode": 5 args, 44 insns, local 49152 B, constants 16 B, barrier
  arg0 x: in buffer bf16
  arg1 w: in buffer q4_K
  arg2 y: out buffer f32
  arg3 acc: inout buffer f32
  arg4 alpha: in scalar f32
  0000: nop
  0001: special r0, block_id
  0002: special r1, block_count
  0003: special r2, arg_value arg4
  0004: special r3, arg_bytes arg0
  0005: li r4, 0
  0006: mov r5, r4
  0007: alu.add r6, r0, r1
  0008: alui.shl r7, r0, 4
  0009: falu.mul r8, r2, r2
  0010: i2f r9, r1
  0011: f2i r10, r9
  0012: tdef t0, f32, 16 x 64, local 0
  0013: tdef t1, bf16, 16 x 64, local 4096
  0014: tdef t2, f32, r1 x 64, local 8192 + r7
  0015: tdef t3, i32, 16 x 1, local 6144
  0016: tdef t4, f32, 16 x 256, local 16384
  0017: tdef t5, f32, 16 x 1, local 6208
  0018: tdef t6, f32, 64 x 64, local 32768
  0019: tld t1, arg0[r0], bf16
  0020: tld t1, arg0[r0], stride r6, bf16
  0021: tcvt t0, t1
  0022: tldq t4, arg1[r0], stride_bytes r6, q4_K
  0023: tgather t1, arg0[t3], pitch_bytes r6, bf16
  0024: tfill t2, r8
  0025: tbin.add t0, t0, t0
  0026: tbin.mul t0, t0, t5, bcast_col
  0027: tun.exp t0, t0
  0028: tsop.mul t0, t0, r2
  0029: tred.sum t5, t0
  0030: tbcast t0, t5, col
  0031: tmma t6, t0, t6, trans_b, accumulate
  0032: tget r9, t0[r0]
  0033: li r10, 2
  0034: loop r10 -> 0039
  0035:   tld t0, const[r4], f32
  0036:   loop r10 -> 0038
  0037:     tst t0, arg2[r0], f32
  0038:   endloop -> 0036
  0039: endloop -> 0034
  0040: barrier
  0041: tld t0, arg3[r0], f32
  0042: tst t0, arg3[r0], f32
  0043: exit
  const 0000: 00 00 80 3f 00 00 00 40 00 00 40 40 00 00 80 40
