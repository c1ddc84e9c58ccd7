"""Bug: x's dtype is not checked against the layer's: a float64 x into a float32 layer reaches
the first matmul, which raises RuntimeError ("expected mat1 and mat2 to have the same dtype"),
where the course's conventions raise TypeError for a dtype, naming it.

Caught by: test_x_of_another_dtype_than_the_layer_raises_type_error ("into a float32 layer:
expected TypeError, got RuntimeError").
"""
SELECT = "test_x_of_another_dtype_than_the_layer_raises_type_error and fp64"
MESSAGE = "into a float32 layer: expected TypeError"
MUTATE = [("        if x.dtype != self.wq.weight.dtype:\n"
           "            raise TypeError(f\"x is {x.dtype}, the layer's parameters are {self.wq.weight.dtype}: convert one to \"\n"
           "                            f\"the other (layer.to(dtype))\")\n", "")]
