from keras_rs.src.testing.test_case import TestCase
from keras_rs.src.testing.test_case import uses_gpu
