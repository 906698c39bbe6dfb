kernel "rope neox 2x64 tokens 4": 5 args, 61 insns, local 6464 B, constants 160 B
  arg0 x: in buffer f32
  arg1 out: out buffer f32
  arg2 pos: in scalar i32
  arg3 base: in scalar f32
  arg4 rows: in scalar i32
  0000: tdef t0, f32, 1 x 32, local 0
  0001: tdef t1, f32, 1 x 32, local 128
  0002: li r11, 0
  0003: tld t0, const[r11], f32
  0004: special r11, arg_value arg3
  0005: tfill t1, r11
  0006: tun.log t1, t1
  0007: tbin.mul t1, t1, t0
  0008: tun.exp t1, t1
  0009: special r0, block_id
  0010: special r3, arg_value arg4
  0011: alui.add r4, r3, 3
  0012: alui.div r4, r4, 4
  0013: alui.max r5, r4, 0
  0014: alui.add r5, r5, 0
  0015: alui.div r5, r5, 1
  0016: alu.mul r1, r0, r5
  0017: alu.sub r2, r4, r1
  0018: alu.min r2, r2, r5
  0019: alui.max r2, r2, 0
  0020: alui.mul r12, r1, 4
  0021: alu.sub r6, r3, r12
  0022: alui.mul r6, r6, 2
  0023: alui.mul r8, r12, 512
  0024: li r10, 64
  0025: special r13, arg_value arg2
  0026: loop r2 -> 0059
  0027:   alui.min r7, r6, 8
  0028:   tdef t2, f32, r7 x 1, local 256
  0029:   tdef t3, f32, r7 x 32, local 320
  0030:   tdef t4, f32, r7 x 32, local 1344
  0031:   tdef t5, f32, r7 x 32, local 2368
  0032:   tdef t6, f32, r7 x 32, local 3392
  0033:   tdef t7, f32, r7 x 32, local 4416
  0034:   tdef t8, f32, r7 x 32, local 5440
  0035:   li r11, 128
  0036:   tld t2, const[r11], f32
  0037:   alu.add r11, r13, r12
  0038:   i2f r11, r11
  0039:   tsop.add t2, t2, r11
  0040:   tbcast t3, t1, row
  0041:   tbin.mul t3, t3, t2, bcast_col
  0042:   tun.sin t4, t3
  0043:   tun.cos t3, t3
  0044:   alui.add r9, r8, 128
  0045:   tld t5, arg0[r8], stride r10, f32
  0046:   tld t6, arg0[r9], stride r10, f32
  0047:   tbin.mul t7, t5, t3
  0048:   tbin.mul t8, t6, t4
  0049:   tbin.sub t7, t7, t8
  0050:   tst t7, arg1[r8], stride r10, f32
  0051:   tbin.mul t8, t5, t4
  0052:   tbin.mul t6, t6, t3
  0053:   tbin.add t6, t8, t6
  0054:   tst t6, arg1[r9], stride r10, f32
  0055:   alui.mul r14, r7, 256
  0056:   alu.add r8, r8, r14
  0057:   alu.sub r6, r6, r7
  0058:   alui.add r12, r12, 4
  0059: endloop -> 0026
  0060: exit
  const 0000: 00 00 00 80 00 00 00 bd 00 00 80 bd 00 00 c0 bd
  const 0010: 00 00 00 be 00 00 20 be 00 00 40 be 00 00 60 be
  const 0020: 00 00 80 be 00 00 90 be 00 00 a0 be 00 00 b0 be
  const 0030: 00 00 c0 be 00 00 d0 be 00 00 e0 be 00 00 f0 be
  const 0040: 00 00 00 bf 00 00 08 bf 00 00 10 bf 00 00 18 bf
  const 0050: 00 00 20 bf 00 00 28 bf 00 00 30 bf 00 00 38 bf
  const 0060: 00 00 40 bf 00 00 48 bf 00 00 50 bf 00 00 58 bf
  const 0070: 00 00 60 bf 00 00 68 bf 00 00 70 bf 00 00 78 bf
  const 0080: 00 00 00 00 00 00 00 00 00 00 80 3f 00 00 80 3f
  const 0090: 00 00 00 40 00 00 00 40 00 00 40 40 00 00 40 40
