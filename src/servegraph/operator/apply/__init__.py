"""The apply stage: the desired RayService, whether it is ours and out of date, and the write."""
