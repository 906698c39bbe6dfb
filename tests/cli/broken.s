# A listing with a mistake on line 5: a tile register where mov takes a scalar one.
kernel "broken": 1 args, 2 insns, local 0 B, constants 0 B
  arg0 x: in buffer f32
  0000: li r0, 0
  0001: mov r0, t1
