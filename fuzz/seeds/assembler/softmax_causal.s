kernel "softmax 4x8 causal": 2 args, 50 insns, local 80 B, constants 0 B
  arg0 x: in buffer f32
  arg1 out: out buffer f32
  0000: special r0, block_id
  0001: alui.mul r1, r0, 1
  0002: li r2, 2
  0003: alu.sub r2, r2, r1
  0004: alui.min r2, r2, 1
  0005: alui.max r2, r2, 0
  0006: li r7, 0
  0007: alui.mul r8, r1, 2
  0008: alui.mul r3, r8, 32
  0009: alui.mul r4, r8, -1
  0010: alui.add r4, r4, 4
  0011: tdef t6, f32, 1 x 1, local 64
  0012: tdef t7, f32, 1 x 1, local 72
  0013: loop r2 -> 0048
  0014:   alui.min r5, r4, 2
  0015:   tdef t0, f32, r5 x 8, local 0
  0016:   tld t0, arg0[r3], f32
  0017:   li r9, 0
  0018:   mov r15, r5
  0019:   loop r15 -> 0043
  0020:     alui.add r11, r8, 5
  0021:     alui.min r11, r11, 8
  0022:     alui.max r11, r11, 0
  0023:     li r10, 0
  0024:     alu.sub r12, r11, r10
  0025:     alui.mul r13, r10, 4
  0026:     alu.add r13, r13, r9
  0027:     tdef t3, f32, 1 x r12, local 0 + r13
  0028:     tred.max t6, t3
  0029:     tbin.sub t3, t3, t6, bcast_col
  0030:     tun.exp t3, t3
  0031:     tred.sum t7, t3
  0032:     tbin.div t3, t3, t7, bcast_col
  0033:     tdef t4, f32, 1 x r10, local 0 + r9
  0034:     tfill t4, r7
  0035:     alui.mul r14, r11, -1
  0036:     alui.add r14, r14, 8
  0037:     alui.mul r13, r11, 4
  0038:     alu.add r13, r13, r9
  0039:     tdef t5, f32, 1 x r14, local 0 + r13
  0040:     tfill t5, r7
  0041:     alui.add r8, r8, 1
  0042:     alui.add r9, r9, 32
  0043:   endloop -> 0019
  0044:   tst t0, arg1[r3], f32
  0045:   alui.mul r6, r5, 32
  0046:   alu.add r3, r3, r6
  0047:   alu.sub r4, r4, r5
  0048: endloop -> 0013
  0049: exit
