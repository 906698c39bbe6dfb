kernel "transpose f32 8x8": 2 args, 37 insns, local 768 B, constants 256 B
  arg0 src: in buffer f32
  arg1 dst: out buffer f32
  0000: special r0, block_id
  0001: alui.mul r1, r0, 1
  0002: li r2, 1
  0003: alu.sub r2, r2, r1
  0004: alui.min r2, r2, 1
  0005: alui.max r2, r2, 0
  0006: li r9, 0
  0007: li r10, 8
  0008: li r11, 8
  0009: li r12, 8
  0010: loop r2 -> 0035
  0011:   alui.rem r3, r1, 1
  0012:   alui.mul r3, r3, 8
  0013:   alui.div r4, r1, 1
  0014:   alui.mul r4, r4, 8
  0015:   alui.mul r5, r3, -1
  0016:   alui.add r5, r5, 8
  0017:   alui.min r5, r5, 8
  0018:   alui.mul r6, r4, -1
  0019:   alui.add r6, r6, 8
  0020:   alui.min r6, r6, 8
  0021:   tdef t0, f32, r6 x r6, local 0
  0022:   tld t0, const[r9], stride r10, f32
  0023:   tdef t1, f32, r5 x r6, local 256
  0024:   alui.mul r7, r3, 8
  0025:   alu.add r7, r7, r4
  0026:   alui.mul r7, r7, 4
  0027:   tld t1, arg0[r7], stride r11, f32
  0028:   tdef t2, f32, r6 x r5, local 512
  0029:   tmma t2, t0, t1, trans_b
  0030:   alui.mul r7, r4, 8
  0031:   alu.add r7, r7, r3
  0032:   alui.mul r7, r7, 4
  0033:   tst t2, arg1[r7], stride r12, f32
  0034:   alui.add r1, r1, 1
  0035: endloop -> 0010
  0036: exit
  const 0000: 00 00 80 3f 00 00 00 00 00 00 00 00 00 00 00 00
  const 0010: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
  const 0020: 00 00 00 00 00 00 80 3f 00 00 00 00 00 00 00 00
  const 0030: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
  const 0040: 00 00 00 00 00 00 00 00 00 00 80 3f 00 00 00 00
  const 0050: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
  const 0060: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 80 3f
  const 0070: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
  const 0080: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
  const 0090: 00 00 80 3f 00 00 00 00 00 00 00 00 00 00 00 00
  const 00a0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
  const 00b0: 00 00 00 00 00 00 80 3f 00 00 00 00 00 00 00 00
  const 00c0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
  const 00d0: 00 00 00 00 00 00 00 00 00 00 80 3f 00 00 00 00
  const 00e0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
  const 00f0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 80 3f
